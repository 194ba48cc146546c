"""Files the farm may trust: the rules for every path it reads or writes.

* ``private``  -- everything outside the shared cache (Inductor's cache, memos, native
  build, logs, locks, reports): created 0700 or checked (owner, mode, no links,
  ancestors); new files ``O_EXCL|O_NOFOLLOW``.
* ``safeio``   -- bounded, link-safe reads of shared files (the shared cache's and the
  key file's); ``UnsafeFile``.
* ``fsutil``   -- small shared file utilities (``atomic_write``, ``fsync_dir``, ``memo_dir``).

The bottom room of the core: it imports no other room.  Import the modules
(``from aoti_farm.security import private``); nothing is re-exported here.
"""
