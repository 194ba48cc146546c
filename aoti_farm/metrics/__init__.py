"""Counting and exposing what the farm does.

* ``counters``   -- the one counter shape (``Counters``: named, per-thread dicts).
* ``exposition`` -- a ``prometheus_client`` registry over HTTP (hook and ``serve``).

Imports only ``security`` (and ``errors``).  Nothing is re-exported here.
"""
