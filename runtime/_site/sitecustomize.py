"""Installed into programs started by ``aoti-farm run`` / ``aoti-farm record``.

The launcher puts this directory first on PYTHONPATH; Python imports this module at
start-up.  It does nothing unless AOTI_FARM_HOOK (the hook's arguments) or AOTI_FARM_RECORD_DIR is set, and it
never stops the program: a failure is one line on stderr.
"""

import os
import sys

if os.environ.get("AOTI_FARM_HOOK", "0") != "0" or os.environ.get("AOTI_FARM_RECORD_DIR"):
    try:
        from aoti_farm.runtime import launch as _aoti_farm_launch

        _aoti_farm_launch.boot()
    except Exception as _e:  # noqa: BLE001
        print(f"aoti-farm: hook not installed in pid {os.getpid()}: {type(_e).__name__}: {_e}", file=sys.stderr)
