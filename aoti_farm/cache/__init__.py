"""The shared kernel cache: one plain directory (local disk or NFS) that many hosts and
processes write and read, where nothing read is trusted until checked.

Its parts, from the bottom up (each module's docstring says more):

  ``layout``          names in the cache directory: the format version, an entry's file names,
                      ``check_key``/``check_fp`` (no name read from a file ever becomes a path
                      unchecked).
  ``elfstack``        a kernel library's ELF stack request: refused where it asks for an
                      executable stack; the compiler clears the one AOTI's link makes.
  ``manifest``        one entry's manifest: decode and shape checks, HMAC, file hashes;
                      ``Entry``, ``BadEntry(kind)``.
  ``store``           the cache itself: ``Cache(root, signing_key=None, allow_insecure=False)``
                      publishes (atomically), opens (checked), lists, removes entries; the
                      directory layout is in its docstring.
  ``opening``         opening a cache for a command or the farm: ``open_cache(...)`` (an
                      unusable directory is a one-line ``UserError``).
  ``records``         the small shared records beside the entries (queue items, leases,
                      failure records, fingerprint.json): walked by descriptor, read bounded,
                      schema-checked; ``BadRecord(kind)``.
  ``failures``        failure records (a refused or failed compile, not retried).
  ``leases``          one compiler per signature fleet-wide: ``try_acquire``, ``Lease``.
  ``queue``           the runtime miss queue (serving processes' misses): ``enqueue``,
                      ``pending``, ``read``, ``done``.
  ``index``           an index of a cache's keys for ``aoti-farm explain``: ``CacheIndex``.
  ``verify_records``  ``cache verify``/``--repair`` and ``stats`` for the records and the
                      cache's directories.

Every read of a shared file goes through ``aoti_farm.security.safeio`` (bounded, link-safe
reads: ``open_regular``, ``read_bounded``, ``open_dir``/``walk``, ``private_copy``;
``UnsafeFile(kind)``), which ``security.private`` and the key file's reader use too.

Not here, on purpose: ``aoti_farm.security.private`` and ``aoti_farm.security.fsutil`` (this
host's own private 0700 files, never the shared cache), ``aoti_farm.compile.widen`` (the
hook's miss policy) and
``runtime/index.py`` (a serving process's in-memory index, built through ``store``).

This package imports nothing itself: import a part, e.g.
``from aoti_farm.cache.store import Cache`` or ``from aoti_farm.cache import leases``.
"""
