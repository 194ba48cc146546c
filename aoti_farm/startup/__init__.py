"""Starting the farm's processes fast and safely.

* ``spawn``        -- every process the farm starts imports only the farm's and the
  environment's code (``python(...)`` with ``-P``, ``private_cwd``, ``lowest_priority``).
* ``loadenv``      -- the libstdc++ trap when loading AOTI libraries (probe, child env).
* ``isaload``      -- the ISA probe's load checks without ``import torch`` per child.
* ``hostid``       -- this host's identity for its memos (CPU id, the ISA memo).
* ``pycache``      -- a private bytecode cache for the farm's children.
* ``pyprecompile`` -- that cache filled ahead of the importers, from ``import_path.txt``
  (the modules a ``warm``'s processes import; ``python -m aoti_farm.startup.pyprecompile --write``).
* ``notices``      -- library notices the farm's own processes drop.
* ``ompwait``      -- the OpenMP wait policy of the compile processes.

Below ``fingerprint`` and every compile room; imports ``config``, ``trace``,
``security``.  Nothing is re-exported here.
"""
