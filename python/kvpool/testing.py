"""A real kvpoold child process for tests: yours and kvpool's own.

    with kvpool.testing.Daemon() as d:
        c = kvpool.Client(d.socket, namespace="test")
        ...
        d.kill()        # SIGKILL: host-only blocks are lost, disk and sessions survive
        d.start()       # same data directory, same socket

The daemon binary is $KVPOOL_KVPOOLD, else `kvpoold` on PATH, else the repository's
build/daemon/kvpoold. The data directory lives under a temporary directory removed on close.
Not thread-safe: one test thread drives one Daemon.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import time

_DEFAULT_FLAGS = (
    "--host_capacity=256MiB",
    "--host_segment_size=16MiB",
    "--disk_capacity=2GiB",
    "--lock_memory=false",
    "--io_threads=2",
    "--worker_threads=4",
)


def find_kvpoold() -> str:
    """Path of the kvpoold binary to run; FileNotFoundError when there is none."""
    env = os.environ.get("KVPOOL_KVPOOLD")
    if env:
        return env
    on_path = shutil.which("kvpoold")
    if on_path:
        return on_path
    repo_build = pathlib.Path(__file__).resolve().parents[2] / "build" / "daemon" / "kvpoold"
    if repo_build.exists():
        return str(repo_build)
    raise FileNotFoundError("kvpoold not found: set KVPOOL_KVPOOLD or put kvpoold on PATH")


class Daemon:
    """kvpoold on a temporary data directory and socket; `flags` are appended to the defaults
    (256 MiB host tier in 16 MiB segments, 2 GiB disk tier, unlocked memory)."""

    def __init__(self, flags: list[str] | None = None, binary: str | None = None):
        self.binary = binary or find_kvpoold()
        self._tmp = tempfile.TemporaryDirectory(prefix="kvpool-test-")
        root = pathlib.Path(self._tmp.name)
        self.data_dir = str(root / "data")
        self.socket = str(root / "kvpool.sock")
        self.log_path = str(root / "kvpoold.log")
        self.flags = list(flags or [])
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> "Daemon":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self, timeout: float = 30.0) -> None:
        """Starts kvpoold and waits until its socket accepts a connection."""
        if self.running:
            return
        args = [self.binary, f"--data_dir={self.data_dir}", f"--socket={self.socket}",
                *_DEFAULT_FLAGS, *self.flags]
        log = open(self.log_path, "ab")
        self._proc = subprocess.Popen(args, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + timeout
        import socket as _socket
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"kvpoold exited with {self._proc.returncode}:\n{self.log()}")
            try:
                with _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM) as s:
                    s.connect(self.socket)
                return
            except OSError:
                time.sleep(0.05)
        self.kill()
        raise TimeoutError(f"kvpoold did not listen within {timeout} s:\n{self.log()}")

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (host-only blocks are written down first) and wait; returns the exit code."""
        if not self._proc:
            return 0
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        code = self._proc.returncode
        self._proc = None
        return code

    def pause(self, timeout: float = 10.0) -> None:
        """SIGSTOP, then waits until every thread of the daemon has stopped (the signal takes
        effect asynchronously): from then on it answers nothing, as a hung daemon would."""
        assert self._proc is not None and self._proc.poll() is None, "kvpoold is not running"
        os.kill(self._proc.pid, signal.SIGSTOP)
        tasks = pathlib.Path(f"/proc/{self._proc.pid}/task")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = []
            for stat in tasks.glob("*/stat"):
                try:
                    # "pid (comm) S ...": the state follows the last ')'.
                    states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
                except (FileNotFoundError, IndexError):
                    continue
            if states and all(s in ("T", "t") for s in states):
                return
            time.sleep(0.005)
        raise TimeoutError(f"kvpoold did not stop within {timeout} s")

    def resume(self) -> None:
        """SIGCONT: the paused daemon answers again."""
        if self._proc is not None and self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL and wait: what a crash does."""
        if self._proc and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def restart(self, hard: bool = False) -> None:
        """Stops (SIGKILL when `hard`) and starts again on the same data directory."""
        self.kill() if hard else self.stop()
        self.start()

    def printed_address(self, scheme: str, timeout: float = 10.0) -> str:
        """The first address the daemon's log names with `scheme` ("tcp://", "tls://"), up to the
        next space, newline or path, waiting up to `timeout` s for it: the startup banner names
        a TCP listener's bound address (so `--listen=tcp://127.0.0.1:0` needs no free-port
        guess) once it listens. Empty when none came in time."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.log()
            at = text.find(scheme)
            if at >= 0:
                end = at + len(scheme)
                while end < len(text) and text[end] not in " \n/":
                    end += 1
                if end < len(text):
                    return text[at:end]
            if time.monotonic() >= deadline:
                return ""
            time.sleep(0.02)

    def log(self) -> str:
        try:
            return pathlib.Path(self.log_path).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def close(self) -> None:
        self.kill()
        self._tmp.cleanup()
