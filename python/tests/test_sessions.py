"""Sessions: save, load, list, delete, and survival across a daemon restart."""

import numpy as np
import pytest

import kvpool


def test_sessions_survive_a_restart(own_daemon, make_keys):
    keys = make_keys(3)
    blocks = [np.full(8192, i, np.uint8) for i in range(3)]
    with kvpool.Client(own_daemon.socket, namespace="test") as c:
        assert c.put(keys, blocks).stored == 3
        c.save_session("chat-1", keys, 48, {"model": "test", "turn": "3"})
        c.save_session("chat-2", keys[:1], 16)
        c.save_session("other", keys[:2], 32)
    own_daemon.restart()  # SIGTERM: host blocks are written down first
    with kvpool.Client(own_daemon.socket, namespace="test") as c:
        s = c.load_session("chat-1")
        assert s.session_id == "chat-1" and s.keys == keys and s.token_count == 48
        assert s.metadata == {"model": "test", "turn": "3"}
        assert s.cached_blocks == 3 and s.updated_unix_ms > 0 and s.created_unix_ms > 0
        assert sorted(x.session_id for x in c.list_sessions()) == ["chat-1", "chat-2", "other"]
        listed = c.list_sessions("chat-")
        assert sorted((x.session_id, x.blocks, x.token_count) for x in listed) == [
            ("chat-1", 3, 48), ("chat-2", 1, 16)]
        assert c.get(keys) == [b.tobytes() for b in blocks]
        c.delete_session("chat-1")
        with pytest.raises(kvpool.NotFound) as e:
            c.load_session("chat-1")
        assert e.value.code == "NotFound"
        assert len(c.list_sessions(limit=1)) == 1


def test_load_of_a_missing_session_is_not_found(daemon):
    with kvpool.Client(daemon.socket, namespace="test") as c:
        with pytest.raises(kvpool.NotFound):
            c.load_session("no-such-session")


def test_saving_a_session_of_uncached_blocks_fails(daemon, make_keys):
    with kvpool.Client(daemon.socket, namespace="test") as c:
        with pytest.raises(kvpool.FailedPrecondition):
            c.save_session("dangling", make_keys(2), 32)
