"""What a user reads about the farm's work.

* ``progress``    -- warm progress and the report JSON (``Tally``, ``write_report``).
* ``report_html`` -- the report as one HTML page.
* ``explain``     -- ``aoti-farm explain``: what a serving process would do with each
  signature, and why.

A top room: imports ``cache``, ``speedgate``, ``dynamic``, ``metrics`` and the flat core.
"""
