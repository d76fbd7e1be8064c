"""TLS from Python: a kvpoold whose TCP listener speaks TLS and asks for client certificates;
kvpool.Client over tls:// with the CA and a client certificate moves blocks byte for byte, and
refuses (or is refused) without them. The connectors' configuration keys (credential_file,
tls_*) reach the client through kvpool._options.client_kwargs. Certificates are made with the
openssl command line."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

import kvpool
from kvpool._options import client_kwargs
from kvpool.testing import Daemon

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl binary")


def _openssl(*args: str, cwd: pathlib.Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _signed(d: pathlib.Path, name: str, ca: str, san: str | None) -> None:
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    ext = d / f"{name}.ext"
    ext.write_text(f"subjectAltName={san}\n" if san else "basicConstraints=CA:FALSE\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "1", "-extfile", ext.name, cwd=d)
    (d / f"{name}.key").chmod(0o600)


def _ca(d: pathlib.Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "1", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign", cwd=d)


@pytest.fixture(scope="module")
def tls_daemon(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    _ca(d, "ca")
    _ca(d, "other-ca")
    _signed(d, "server", "ca", "IP:127.0.0.1")
    _signed(d, "client", "ca", None)
    # Port 0, and the address the daemon prints once it listens: a port picked free beforehand
    # could be taken in between, and the Unix socket can answer before the TLS listener does.
    flags = ["--listen=tcp://127.0.0.1:0", f"--tls_cert={d / 'server.pem'}",
             f"--tls_key={d / 'server.key'}", f"--tls_ca={d / 'ca.pem'}"]
    with Daemon(flags) as daemon:
        daemon.tls_address = daemon.printed_address("tls://")
        assert daemon.tls_address, f"no tls:// address in the daemon's log:\n{daemon.log()}"
        daemon.certs = d
        yield daemon


def test_blocks_cross_tls_byte_for_byte(tls_daemon):
    d = tls_daemon.certs
    keys = kvpool.hash_chain(list(range(64)), secret="s", layout="model=test;dtype=bf16",
                             tokens_per_block=16)
    blocks = [os.urandom(100_000 + i) for i in range(len(keys))]
    with kvpool.Client(tls_daemon.tls_address, namespace="tls", tls_ca=str(d / "ca.pem"),
                       tls_cert=str(d / "client.pem"), tls_key=str(d / "client.key")) as c:
        assert not c.server["ucx"], "auto over tls:// keeps the blocks inside TLS"
        c.put(keys, blocks)
        outs = [bytearray(len(b)) for b in blocks]
        assert all(r.ok for r in c.get_into(keys, outs))
        assert [bytes(o) for o in outs] == blocks


def test_without_the_right_certificates_nothing_connects(tls_daemon):
    d = tls_daemon.certs
    with pytest.raises(kvpool.PermissionDenied, match="does not verify"):
        kvpool.Client(tls_daemon.tls_address, namespace="tls", tls_ca=str(d / "other-ca.pem"),
                      tls_cert=str(d / "client.pem"), tls_key=str(d / "client.key"))
    with pytest.raises(kvpool.Error):
        kvpool.Client(tls_daemon.tls_address, namespace="tls", tls_ca=str(d / "ca.pem"))


def test_connector_configuration_reaches_the_client(tls_daemon, tmp_path):
    d = tls_daemon.certs
    cred = tmp_path / "credential"
    cred.write_text("a-credential-of-enough-bytes\n")
    config = {"remote_storage_plugin.kvpool.credential_file": str(cred),
              "remote_storage_plugin.kvpool.tls_ca": str(d / "ca.pem"),
              "remote_storage_plugin.kvpool.tls_cert": str(d / "client.pem"),
              "remote_storage_plugin.kvpool.tls_key": str(d / "client.key"),
              "unrelated": "x"}
    kwargs = client_kwargs(config, "remote_storage_plugin.kvpool.")
    assert kwargs == {"credential": "a-credential-of-enough-bytes", "tls_ca": str(d / "ca.pem"),
                      "tls_cert": str(d / "client.pem"), "tls_key": str(d / "client.key")}
    tls_only = {k: v for k, v in kwargs.items() if k != "credential"}
    with kvpool.Client(tls_daemon.tls_address, namespace="tls", **tls_only) as c:
        assert c.stats() is not None
    with pytest.raises(ValueError, match="credential_file"):
        client_kwargs({"credential_file": str(tmp_path / "missing")})
