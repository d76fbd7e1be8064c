"""Tenants from Python against a real kvpoold whose namespaces file says who may act for which
namespace: a credential proved at hello, this process's Unix user, admin rights, and
`access: declared` refusing any other namespace."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

import kvpool
from kvpool.testing import Daemon

SECRET_A = "tenant-a-credential-from-python-0123"
# Leading spaces and two lines: a credential file is read whole, less trailing white space, by
# kvpoold, both CLIs and the connectors alike.
ADMIN = "  admin-credential-from-python-0123456\nand-its-second-line"


def _private(path: pathlib.Path, text: str) -> str:
    path.write_text(text + "\n")
    path.chmod(0o600)
    return str(path)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    d = tmp_path_factory.mktemp("access")
    a = _private(d / "tenant-a", SECRET_A)
    admin = _private(d / "admin", ADMIN)
    ns = d / "namespaces.yaml"
    ns.write_text(
        "access: declared\n"
        f"admin: {{credential_file: {admin}}}\n"
        "namespaces:\n"
        f"  tenant-a: {{credential_file: {a}}}\n"
        f"  tenant-b: {{unix_users: [{os.getuid()}]}}\n")
    with Daemon([f"--namespaces_file={ns}"]) as daemon:
        yield daemon


def test_the_credential_opens_its_namespace_and_nothing_else(guarded):
    with pytest.raises(kvpool.PermissionDenied, match="needs its credential"):
        kvpool.Client(guarded.socket, namespace="tenant-a")
    with pytest.raises(kvpool.PermissionDenied, match="wrong credential"):
        kvpool.Client(guarded.socket, namespace="tenant-a", credential="not-it-0123456789abc")
    with pytest.raises(kvpool.PermissionDenied, match="not declared"):
        kvpool.Client(guarded.socket, namespace="tenant-z")

    keys = kvpool.hash_chain(list(range(16)), secret="s", layout="model=test;dtype=bf16",
                             tokens_per_block=16)
    block = os.urandom(4096)
    with kvpool.Client(guarded.socket, namespace="tenant-a", credential=SECRET_A) as a:
        assert not a.server["admin"]
        a.put(keys, [block])
        out = bytearray(len(block))
        assert a.get_into(keys, [out])[0].ok
        assert bytes(out) == block
        stats = a.stats()
        assert stats["namespace_only"]
        assert stats["connections"] == 0
    # tenant-b is this process's user: no credential needed, and tenant-a's block is not its.
    with kvpool.Client(guarded.socket, namespace="tenant-b") as b:
        assert b.lookup(keys, prefetch=False).hit_blocks == 0


def test_admin_rights_need_the_admin_credential(guarded):
    with pytest.raises(kvpool.PermissionDenied):
        kvpool.Client(guarded.socket, namespace="tenant-b", admin=True)
    with kvpool.Client(guarded.socket, namespace="tenant-b", credential=ADMIN, admin=True) as c:
        assert c.server["admin"]
        stats = c.stats()
        assert not stats["namespace_only"]
        assert stats["connections"] >= 1


def test_the_python_cli_shows_a_tenant_its_own_use_and_an_admin_everything(guarded, tmp_path):
    def run(*args):
        r = subprocess.run([sys.executable, "-m", "kvpool", *args], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout

    tenant = _private(tmp_path / "tenant-a", SECRET_A)
    own = run("status", f"--socket={guarded.socket}", "--namespace=tenant-a",
              f"--credential_file={tenant}")
    assert "namespace tenant-a: " in own and "need admin rights: --admin" in own
    assert "connections" not in own
    admin = _private(tmp_path / "admin", ADMIN)
    everything = run(f"--socket={guarded.socket}", "--namespace=tenant-b", "stats", "--admin",
                     f"--credential_file={admin}")
    assert "puts: blocks offered" in everything and "need admin rights" not in everything
