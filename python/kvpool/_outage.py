"""How the engine adapters (kvpool.hf, .vllm, .sglang, .lmcache) report kvpool failures.

An adapter turns every kvpool failure into a miss; the operator still needs to see it, but not
once per request: one warning when kvpool stops answering, debug lines while it stays down, one
info line when it answers again. Not locked: threads that share one (kvpool.sglang's) may log a
line twice, never lose the outage.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from kvpool import _native

# What a kvpool call can raise when the daemon is down, slow or refuses. Anything else is a bug
# in an adapter or the extension: logged with its traceback (and still a miss).
KVPOOL_FAILURES = (_native.Error, OSError, TimeoutError)

# What a call raises when kvpool did not answer in time (a stalled daemon, a cut path) rather
# than refusing at once: such a call cost its whole timeout.
STALLS = (_native.DeadlineExceeded, TimeoutError)


class Stalled(_native.Unavailable):
    """Raised by StallGuard.check while calls are held back after kvpool stalled."""


class StallGuard:
    """After a call that kvpool did not answer in time, the calls of the next while fail at once
    (Stalled) instead of each waiting for its timeout: 0.5 s, doubling while the stalls go on, up
    to 30 s; the first call after that tries kvpool again. An answer ends it; a refusal (nothing
    listens: a failure that costs no time) changes nothing. An engine's scheduling loop asks
    kvpool for every waiting request on every step: without this, a stopped daemon would cost
    each of those asks its timeout. Not thread-safe (as OutageLog)."""

    FIRST = 0.5
    LONGEST = 30.0

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        # (time.monotonic looked up at each call, so that a test can replace this module's time.)
        self._clock = clock if clock is not None else lambda: time.monotonic()
        self._stalls = 0
        self._until = 0.0

    def check(self) -> None:
        """Raises Stalled while calls are held back."""
        if self._stalls:
            left = self._until - self._clock()
            if left > 0:
                raise Stalled(f"kvpool did not answer in time {self._stalls} time(s) in a row; "
                              f"not asked again for {left:.1f} s")

    def failed(self, e: BaseException) -> None:
        if isinstance(e, STALLS) and not isinstance(e, Stalled):
            if self._stalls and self._clock() < self._until:
                return   # calls that were under way when the hold began: one stall, not several
            self._stalls += 1
            wait = min(self.LONGEST, self.FIRST * 2 ** min(self._stalls - 1, 16))
            self._until = self._clock() + wait

    def answered(self) -> None:
        self._stalls = 0


def close_quietly(client: "_native.Client | None") -> None:
    """Closes a client an adapter is dropping after a failure; a broken client must not raise."""
    if client is None:
        return
    try:
        client.close()
    except Exception:  # noqa: BLE001 - whatever a broken connection raises on close
        pass


class OutageLog:
    """`name` prefixes every line (e.g. "kvpool.vllm"); `consequence` says what the adapter does
    while kvpool is down (e.g. "serving misses and skipping stores")."""

    def __init__(self, logger: logging.Logger, name: str, consequence: str) -> None:
        self._log = logger
        self._name = name
        self._consequence = consequence
        self.healthy = True

    def failed(self, what: str, e: BaseException) -> None:
        """A call (`what`: "lookup", "get", ...) failed with `e`."""
        if not self.healthy:
            self._log.debug("%s: %s failed again (%s: %s)", self._name, what, type(e).__name__, e)
            return
        self.healthy = False
        if isinstance(e, KVPOOL_FAILURES):
            self._log.warning("%s: %s failed (%s: %s); %s until kvpool answers again", self._name,
                              what, type(e).__name__, e, self._consequence)
        else:
            self._log.warning("%s: %s failed unexpectedly; treated as a miss", self._name, what,
                              exc_info=e)

    def answered(self) -> None:
        """A call succeeded."""
        if not self.healthy:
            self.healthy = True
            self._log.info("%s: kvpool answers again", self._name)


class LossyLoads:
    """Blocks an adapter loaded that kvpool decoded from a lossy copy: approximate KV, which a
    namespace's policy (an encoding with `lossy: true`) allows. Counted in `blocks`, and said once
    per adapter on its logger, so an operator who chose lossy copies sees them used. Adapters
    load from several threads: the count and the line are under a lock (taken only for results
    that were decoded from lossy copies)."""

    def __init__(self, logger: logging.Logger, adapter: str) -> None:
        self._log = logger
        self._adapter = adapter
        self._lock = threading.Lock()
        self._said = False
        self.blocks = 0

    def add(self, results) -> None:
        """Counts the results (kvpool GetResults the engine uses) decoded from lossy copies."""
        n = sum(1 for r in results if r.ok and r.lossy)
        if not n:
            return
        with self._lock:
            self.blocks += n
            if self._said:
                return
            self._said = True
            self._log.info("%s: loading blocks kvpool decoded from lossy copies (the namespace's "
                           "policy): approximate KV, counted in %s.lossy.blocks",
                           self._adapter, self._adapter)
