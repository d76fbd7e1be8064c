"""How the engine adapters (kvpool.hf, .vllm, .sglang, .lmcache) report kvpool failures.

An adapter turns every kvpool failure into a miss; the operator still needs to see it, but not
once per request: one warning when kvpool stops answering, debug lines while it stays down, one
info line when it answers again. Not thread-safe by itself: an adapter calls it from the thread
that owns its client (or under its own lock).
"""

from __future__ import annotations

import logging

from kvpool import _native

# What a kvpool call can raise when the daemon is down, slow or refuses. Anything else is a bug
# in an adapter or the extension: logged with its traceback (and still a miss).
KVPOOL_FAILURES = (_native.Error, OSError, TimeoutError)


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
