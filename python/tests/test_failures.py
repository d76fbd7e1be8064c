"""The daemon failing under a client: the GIL stays free while a call waits, a dead daemon is
Unavailable (or DeadlineExceeded), and the next call after a restart reconnects by itself."""

import os
import signal
import sys
import threading
import time

import numpy as np
import pytest

import kvpool


def test_gil_is_released_while_a_call_waits(own_daemon, make_keys):
    """The daemon is stopped (SIGSTOP) and only a second Python thread can wake it (SIGCONT).
    With the interpreter's switch interval set huge, that thread can run only when the main
    thread gives the GIL up of its own accord: if get_into held the GIL while it waited, the
    daemon would stay stopped and the call would end in DeadlineExceeded; it succeeds only
    because the other thread ran during the call."""
    keys = make_keys(2)
    with kvpool.Client(own_daemon.socket, namespace="test", timeout=20) as c:
        c.put(keys, [b"a" * 4096, b"b" * 4096])
        woke = []

        def wake():
            time.sleep(0.2)  # releases the GIL; afterwards this thread needs it back
            os.kill(own_daemon.pid, signal.SIGCONT)
            woke.append(True)

        old = sys.getswitchinterval()
        os.kill(own_daemon.pid, signal.SIGSTOP)
        sys.setswitchinterval(1000.0)
        try:
            t = threading.Thread(target=wake)
            t.start()
            out = [bytearray(4096), bytearray(4096)]
            res = c.get_into(keys, out)
            t.join()
        finally:
            sys.setswitchinterval(old)
            os.kill(own_daemon.pid, signal.SIGCONT)
        assert woke and all(res), res
        assert bytes(out[0]) == b"a" * 4096 and bytes(out[1]) == b"b" * 4096


def test_a_stopped_daemon_gives_deadline_exceeded_not_a_hang(own_daemon, make_keys):
    keys = make_keys(1)
    with kvpool.Client(own_daemon.socket, namespace="test", timeout=1) as c:
        own_daemon.pause()
        try:
            with pytest.raises((kvpool.DeadlineExceeded, kvpool.Unavailable)):
                c.lookup(keys)
        finally:
            own_daemon.resume()
        assert c.lookup(keys).hit_blocks == 0  # and it recovers


@pytest.mark.parametrize("data_path", ["socket", "shm"])
def test_daemon_killed_mid_use_then_restarted(own_daemon, make_keys, data_path):
    keys = make_keys(2)
    blocks = [np.full(4096, 1, np.uint8), np.full(4096, 2, np.uint8)]
    with kvpool.Client(own_daemon.socket, namespace="test", timeout=3, data_path=data_path) as c:
        assert c.put(keys, blocks).stored == 2
        own_daemon.kill()  # SIGKILL: host-only blocks are lost
        with pytest.raises(kvpool.Unavailable):
            c.lookup(keys)
        with pytest.raises(kvpool.Unavailable):
            c.get_into(keys, [bytearray(4096), bytearray(4096)])
        own_daemon.start()
        # auto_reconnect: the next call connects to the new daemon; the data survived or not,
        # but the answer is a clean one.
        hit = c.lookup(keys)
        assert 0 <= hit.hit_blocks <= 2
        assert c.put(keys, blocks).all_ok()
        out = [np.zeros(4096, np.uint8), np.zeros(4096, np.uint8)]
        assert all(c.get_into(keys, out))
        np.testing.assert_array_equal(out[1], blocks[1])


def test_without_auto_reconnect_an_explicit_reconnect_is_needed(own_daemon, make_keys):
    keys = make_keys(1)
    with kvpool.Client(own_daemon.socket, namespace="test", timeout=3,
                       auto_reconnect=False) as c:
        own_daemon.restart(hard=True)
        with pytest.raises(kvpool.Unavailable):
            c.lookup(keys)
        c.reconnect()
        assert c.lookup(keys).hit_blocks == 0


def test_a_stall_guard_holds_calls_back_once_per_stall_and_doubles():
    """kvpool._outage.StallGuard, as the engine adapters use it (on a clock of the test's)."""
    from kvpool._outage import Stalled, StallGuard

    now = [100.0]
    g = StallGuard(lambda: now[0])
    g.check()
    g.failed(kvpool.Unavailable("nothing listens"))   # a refusal costs no time: no hold
    g.check()
    g.failed(kvpool.DeadlineExceeded("no answer"))
    with pytest.raises(Stalled) as held:
        g.check()
    assert isinstance(held.value, kvpool.Unavailable)  # what adapters already take as a miss
    g.failed(kvpool.DeadlineExceeded("under way when the hold began"))   # not a second stall
    now[0] += 0.51
    g.check()                                          # 0.5 s, once
    g.failed(TimeoutError("no answer again"))
    now[0] += 0.9
    with pytest.raises(Stalled):
        g.check()                                      # doubled: 1 s
    now[0] += 0.11
    g.check()
    g.answered()                                       # an answer ends it
    g.failed(kvpool.DeadlineExceeded("a new stall"))
    now[0] += 0.51
    g.check()                                          # back to 0.5 s
