"""Ray compile actors (imported as aoti_farm.workers).

This folder is the package ``aoti_farm.workers``: pyproject's ``package-dir`` installs it
there, and in a source checkout ``aoti_farm/__init__.py`` maps the name to this folder.
Imports of this package's own modules are relative (``from .placement import route``), so
a reader or a tool resolves them from the folder; imports of the core are absolute
(``from aoti_farm.compile import job``).
"""
