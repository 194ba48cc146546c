"""Interop with torch's own ``aoti_eager`` kernel cache.

* ``upstream``      -- ``export_upstream``, ``import_upstream``.
* ``upstream_meta`` -- upstream's metadata format (``meta_info``, ``op_file_names``).

A top room: imports ``compile`` and ``cache``.
"""
