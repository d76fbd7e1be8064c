"""python -m kvpool mirrors the CLI (build/client/kvpool) against a real daemon."""

import json
import os
import subprocess
import sys

import pytest

import kvpool


def _run(*args, cli=None):
    cmd = [cli] if cli else [sys.executable, "-m", "kvpool"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=60)


def test_status_stats_and_sessions(daemon, make_keys):
    keys = make_keys(2)
    with kvpool.Client(daemon.socket, namespace="test") as c:
        c.put(keys, [b"x" * 1000, b"y" * 1000])
        c.save_session("cli-session", keys, 32, {"a": "b"})
    flags = [f"--socket={daemon.socket}", "--namespace=test"]
    st = _run(*flags, "status")
    assert st.returncode == 0, st.stderr
    assert st.stdout.startswith("kvpoold ") and "  host: " in st.stdout
    assert "cluster: standalone" in st.stdout
    js = _run(*flags, "stats", "--json")
    assert js.returncode == 0
    assert json.loads(js.stdout)["tiers"][0]["name"] in ("gpu", "host")
    text = _run(*flags, "stats").stdout
    assert "puts: blocks offered" in text and "index rebuilt at start from 0 disk" in text
    ls = _run(*flags, "sessions", "ls")
    assert ls.returncode == 0 and "cli-session" in ls.stdout
    # --prefix anywhere, as the CLI's flags.
    for args in (("--prefix=cli-", "sessions", "ls"), ("sessions", "ls", "--prefix=cli-")):
        assert "cli-session" in _run(*flags, *args).stdout
    assert "cli-session" not in _run(*flags, "--prefix=other", "sessions", "ls").stdout
    assert _run(*flags, "--prefix=cli-", "status").returncode == 2  # for sessions ls only
    show = json.loads(_run(*flags, "sessions", "show", "cli-session", "--json").stdout)
    assert show["keys"] == [k.hex() for k in keys] and show["metadata"] == {"a": "b"}
    assert _run(*flags, "sessions", "rm", "cli-session").returncode == 0
    missing = _run(*flags, "sessions", "show", "cli-session")
    assert missing.returncode == 1 and "NotFound" in missing.stderr
    # The C++ CLI prints the same status lines (the volatile counters aside).
    cli = os.environ.get("KVPOOL_CLI")
    if cli and os.path.exists(cli):
        theirs = _run(*flags, "status", cli=cli)
        ours = _run(*flags, "status")
        strip = lambda s: [l for l in s.splitlines() if not l.startswith(("kvpoold", "  lookups"))]
        assert strip(ours.stdout) == strip(theirs.stdout)


def test_unreachable_daemon_exits_1(tmp_path):
    r = _run(f"--socket={tmp_path}/none.sock", "status")
    assert r.returncode == 1 and "Unavailable" in r.stderr


def test_flags_may_come_before_or_after_the_command(daemon):
    # As the C++ CLI's: the connection flags and --json anywhere.
    after = _run("status", f"--socket={daemon.socket}", "--namespace=test")
    assert after.returncode == 0, after.stderr
    assert after.stdout.startswith("kvpoold ")
    before = _run(f"--socket={daemon.socket}", "--json", "stats")
    assert before.returncode == 0, before.stderr
    assert "tiers" in json.loads(before.stdout)
    # A flag after the command wins over the same flag before it.
    r = _run(f"--socket={daemon.socket}x", "stats", f"--socket={daemon.socket}", "--json")
    assert r.returncode == 0, r.stderr


def test_an_unreadable_credential_file_is_a_usage_error(daemon, tmp_path):
    r = _run(f"--socket={daemon.socket}", "status", f"--credential_file={tmp_path}/none")
    assert r.returncode == 2 and "credential_file" in r.stderr


def test_a_missing_session_id_is_a_usage_error_before_any_connection(tmp_path):
    r = _run(f"--socket={tmp_path}/none.sock", "sessions", "show")
    assert r.returncode == 2 and "needs a session id" in r.stderr
