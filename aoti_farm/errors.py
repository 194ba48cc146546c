"""The two error types of aoti-farm.

* :class:`UserError` -- bad input (a malformed trace, an unknown op, a bad flag, an
  unusable cache).  The CLI prints its message as one line and exits 2.  The message names
  the input and says how to fix it.
* :class:`FarmError` -- a recoverable failure inside the farm or the cache (a corrupt
  entry, a lost lease, a full disk).  It is logged and counted, never raised into a
  serving process's caller.
* :class:`Ineligible` -- a call or op that aoti-farm will never serve (aliasing, random,
  an argument kind it cannot represent).  Carries the reason, which is counted.
"""


class UserError(Exception):
    """Bad input; printed as one line by the CLI, exit code 2."""


class FarmError(Exception):
    """A recoverable farm/cache failure: logged and counted, then treated as a miss."""


class Ineligible(Exception):
    """This op or call can never be served; ``str(e)`` is the reason."""


class CompileRefused(Exception):
    """A deterministic compile failure or a verification failure: recorded, not retried.

    ``evidence`` holds what was seen (max error, first bad index, ...)."""

    def __init__(self, reason: str, evidence: dict | None = None):
        super().__init__(reason)
        self.reason = reason
        self.evidence = evidence or {}
