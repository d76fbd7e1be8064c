"""The threads an engine adapter moves KV on (kvpool.vllm's loads and saves; kvpool.sglang's
calls from SGLang's own threads use a Link each), and where its puts from GPU memory go
(`gpu_tier_device`).

A `Link` is one thread's kvpool client, made on first use and dropped after a failure so the
next call connects again (a restarted daemon is found), held back for a while after kvpool did
not answer in time (StallGuard: a stalled daemon must not cost every call its timeout), with
each outage logged once through an OutageLog; and the thread's staging buffer, kept from call
to call. A `TransferThread` is one background thread with a Link of its own and, on a GPU, a
CUDA stream of its own that first waits for an event from the engine's stream, so copies into
or out of the engine's KV cache are ordered after what the engine queued. Neither is thread-safe: each belongs to one thread (a
TransferThread's Link to its thread; submit and shutdown to its owner's).
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any, Callable

import torch

import kvpool
from kvpool._outage import OutageLog, Stalled, StallGuard, close_quietly

__all__ = ["Link", "TransferThread", "gpu_tier_device"]


def gpu_tier_device(client: kvpool.Client, staged: torch.Tensor) -> int | None:
    """The gpu_device a put of blocks staged in `staged` passes: its CUDA device where the
    daemon runs a gpu tier there that `client` can map (the blocks are then copied device to
    device into it, and a later load on that GPU reads them device to device); None otherwise
    (host memory, or no gpu tier there: the blocks go into host, from device memory by one
    copy into the shared-memory slot)."""
    if not staged.is_cuda:
        return None
    device = staged.device.index
    if device is None:
        device = torch.cuda.current_device()
    return device if client.gpu_tier(device) is not None else None


class Link:
    """One thread's kvpool client, made on first use and dropped after a failure (so the next
    call connects again and finds a restarted daemon), each outage logged once; and the
    thread's staging buffer."""

    def __init__(self, factory: Callable[[], kvpool.Client], outage: OutageLog,
                 clock: Callable[[], float] | None = None) -> None:
        self._factory = factory
        self._client: kvpool.Client | None = None
        self._outage = outage
        self._stalls = StallGuard(clock)
        self._staging: torch.Tensor | None = None

    def client(self) -> kvpool.Client:
        """The client; raises Stalled (a kvpool.Unavailable) at once for a while after kvpool
        did not answer in time (StallGuard)."""
        self._stalls.check()
        if self._client is None:
            self._client = self._factory()
        return self._client

    def failed(self, what: str, e: BaseException) -> None:
        if isinstance(e, Stalled):
            return   # held back: the failure that began the hold was reported
        self.close()
        self._stalls.failed(e)
        self._outage.failed(what, e)

    def answered(self) -> None:
        self._stalls.answered()
        self._outage.answered()

    def close(self) -> None:
        close_quietly(self._client)
        self._client = None

    def staging(self, shape: tuple[int, ...], dtype: torch.dtype,
                device: torch.device) -> torch.Tensor:
        """A tensor of `shape` over this thread's staging memory, kept from call to call (a
        fresh one would fault in every page again on the host: a third of a load's time)."""
        numel = 1
        for d in shape:
            numel *= d
        buf = self._staging
        if buf is None or buf.numel() < numel or buf.dtype != dtype or buf.device != device:
            buf = self._staging = torch.empty(numel, dtype=dtype, device=device)
        return buf[:numel].view(shape)


class TransferThread:
    """One background thread of an adapter (e.g. kvpool.vllm's loads, or its saves), with a
    kvpool link of its own and, on a GPU, a CUDA stream of its own: work runs there in
    submission order."""

    def __init__(self, name: str, factory: Callable[[], kvpool.Client], outage: OutageLog):
        self.link = Link(factory, outage)
        self._name = name
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._stream: Any = None   # made, and used, on the thread only

    def submit(self, work: Callable[[Any, Link], Any], item: Any, device: torch.device,
               after: Any) -> "concurrent.futures.Future[tuple[Any, float]]":
        """Runs work(item, link) on the thread, for the KV cache on `device`; the future gives
        its result and the seconds it took. `after`: None on the CPU; on a GPU, an event that
        the thread's stream waits for first (what the engine queued before)."""
        if self._executor is None:
            # On a GPU the thread works on the KV cache's device from its start: a thread left
            # on device 0 would make a CUDA context there for every rank of another GPU.
            cuda = device.type == "cuda"
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=self._name,
                initializer=torch.cuda.set_device if cuda else None,
                initargs=(device,) if cuda else ())
        return self._executor.submit(self._run, work, item, device, after)

    def _run(self, work: Callable[[Any, Link], Any], item: Any, device: torch.device,
             after: Any) -> tuple[Any, float]:
        t0 = time.perf_counter()
        if after is None:
            return work(item, self.link), time.perf_counter() - t0
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
        self._stream.wait_event(after)
        try:
            with torch.cuda.stream(self._stream):
                result = work(item, self.link)
        finally:
            # The copies are done once the future is, also when the work raised halfway: an
            # engine may hand a failed load's blocks to another request at once.
            self._stream.synchronize()
        return result, time.perf_counter() - t0

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
        self.link.close()
