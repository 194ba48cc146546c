"""The speed gate's core half: is a kernel faster than eager here?

* ``speed``    -- kernel against eager, timed as the hook serves (``time_served_call``,
  ``time_against_eager``, ``GATE_RATIO``, serve policies).
* ``hostgate`` -- this host's on-host gate decisions, kept in a private per-user memo.
* ``hitpath``  -- building and loading the native hit path (``runtime/fastpath.cpp``),
  for the hook and for the compiler's timing.

The serving side of the gate is ``runtime/gate.py`` and ``runtime/trial.py``.
Imports ``startup``, ``security`` and ``signature``.
"""
