"""The serving hook's poller: when to look at the index again (hot reload).

A daemon thread runs the hook's ``step`` (refresh the index, switch to the native path,
prune and re-check workers, re-route) every ``interval`` seconds, sooner when something
says the index changed:

* while this hook's compile worker (or the native build) runs, its log is followed every
  :data:`WATCH_INTERVAL` seconds: an outcome there triggers the step at once, and the
  worker's busy/idle events set the thread limit (see :mod:`.room`);
* misses this process queued for someone else's compile (``on_miss="queue"``, another
  process's worker, ``aoti-farm serve``) have their shard directories stat'ed as often
  (:meth:`aoti_farm.runtime.misswriter.MissWriter.waiting_shards`);
* a miss just queued or a worker just started wakes it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

log = logging.getLogger("aoti_farm.hook")

#: Seconds between looks at the compile worker's log while it runs.
WATCH_INTERVAL = 0.05


class Poller:
    def __init__(self, interval: float, indexes: dict, writer, supervisor, room, step: Callable[[], None],
                 wake: threading.Event):
        self.interval = interval
        self.indexes, self.writer, self.supervisor, self.room = indexes, writer, supervisor, room
        self._step = step
        self.wake = wake
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="aoti-farm-poll", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while self._wait():
            self._step()

    def _wait(self) -> bool:
        """Sleep until the next step; False when stopping."""
        deadline = time.monotonic() + self.interval
        sup = self.supervisor
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            if not sup.running():
                # the last lines of a worker that just exited (its last outcome)
                if sup.unread() and sup.follow():
                    return True
                self.room.set_compiles(0)
                waiting = self.writer.waiting_shards()
                if waiting is None:
                    self.wake.wait(left)
                    self.wake.clear()
                    if self.stopping.is_set():
                        return False
                    continue
                if self.stopping.wait(min(left, WATCH_INTERVAL)):
                    return False
                if any(self.indexes[d].shards_changed(names) for d, names in waiting.items() if d in self.indexes):
                    return True
                continue
            if self.stopping.wait(min(left, WATCH_INTERVAL)):
                return False
            if sup.follow():
                return True
