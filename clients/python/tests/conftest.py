"""Fixtures: real fencelog servers (one node, and a 3-node cluster) on free
loopback ports below the ephemeral range, each with a temporary data
directory; a TCP proxy that loses a reply; a fake RESP server.

The binary is ``$FENCELOG_BIN``, by default ``target/ci/fencelog`` under the
repository root (``cargo test --workspace --profile ci`` builds it).
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Tuple

import pytest

from fencelog import Client

REPO = Path(__file__).resolve().parents[3]
BIN = Path(os.environ.get("FENCELOG_BIN", REPO / "target" / "ci" / "fencelog"))
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_port(span: int = 1, raft: bool = False) -> int:
    """A port p with p..p+span-1 free (and, for a cluster, their Raft ports
    10000 above), all below the ephemeral range so no outgoing connection
    takes one meanwhile."""
    low = _ephemeral_low()
    top = low - span - (10000 if raft else 0)
    assert top > 11000, f"ephemeral range starts too low: {low}"
    for _ in range(200):
        p = random.randrange(10000, top)
        ports = list(range(p, p + span))
        if raft:
            ports += [q + 10000 for q in ports]
        if all(_free(q) for q in ports):
            return p
    raise RuntimeError("no free port found")


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    """Polls ``cond`` (for states no event announces: a process ready)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Server:
    """One ``fencelog serve`` process."""

    def __init__(self, data_dir: Path, args: Optional[List[str]] = None) -> None:
        if not BIN.exists():
            pytest.fail(f"fencelog binary not found at {BIN}: build it or set FENCELOG_BIN")
        self.port = free_port()
        self.dir = data_dir
        self.args = args or []
        self.log = open(data_dir.parent / f"server-{self.port}.log", "ab")
        self._start()

    def _start(self) -> None:
        self.proc = subprocess.Popen(
            [str(BIN), "serve", "--dir", str(self.dir), "--addr", f"127.0.0.1:{self.port}",
             *self.args],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        wait_until(self._ready, 20, f"fencelog serve on port {self.port}")

    def restart(self) -> None:
        """Stops the server (SIGTERM) and starts it again on its port and
        data directory."""
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self._start()

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"fencelog serve exited with {self.proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
            return True
        except OSError:
            return False

    def pause(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.resume()
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()


class Cluster:
    """``fencelog cluster local --nodes 3``: clients on port..port+2."""

    def __init__(self, base: Path) -> None:
        if not BIN.exists():
            pytest.fail(f"fencelog binary not found at {BIN}: build it or set FENCELOG_BIN")
        self.port = free_port(span=3, raft=True)
        self.ports = [self.port, self.port + 1, self.port + 2]
        self.log = open(base / "cluster.log", "wb")
        self.proc = subprocess.Popen(
            [str(BIN), "cluster", "local", "--nodes", "3", "--port", str(self.port),
             "--dir", str(base / "cluster"),
             # Twice the default: fewer spurious elections on a busy machine.
             "--", "--cluster-election-timeout-ms", "600"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        probe = Client("127.0.0.1", self.port, cluster=True, max_wait=2.0)
        wait_until(lambda: self._leader_known(probe), 30, "a cluster leader")
        probe.close()

    def _leader_known(self, probe: Client) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"fencelog cluster local exited with {self.proc.returncode}")
        try:
            probe.stat("probe")
            return True
        except Exception:
            return False

    def leader(self) -> int:
        """The leader's client port, from CLUSTER SLOTS (the leader first)."""
        c = Client("127.0.0.1", self.port)
        try:
            slots = c.execute("CLUSTER", "SLOTS")
        finally:
            c.close()
        return int(slots[0][2][1])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.log.close()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server shared by the tests that do not stop it."""
    base = tmp_path_factory.mktemp("shared")
    s = Server(base / "data")
    yield s
    s.stop()


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[Server]:
    """A server of this test alone (to pause it, or start it with flags)."""
    s = Server(tmp_path / "data")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    yield c
    c.stop()


@pytest.fixture
def name() -> str:
    """A stream / lease name of this test alone."""
    return f"t-{uuid.uuid4().hex[:12]}"


class Proxy:
    """A loopback TCP proxy that, once armed, loses the first exchange that
    contains ``marker``: ``mode="reply"`` forwards the request and drops the
    reply (the write happened, its answer is lost), ``mode="request"``
    drops the request (nothing happened); then it closes that connection.
    ``mode="stall"`` drops the reply and keeps the connection open (the
    client's read times out).
    ``fired`` is set when it did."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", free_port()))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.marker: Optional[bytes] = None
        self.mode = "reply"
        self.stall = False
        self.fired = threading.Event()
        self._lock = threading.Lock()
        self._closed = False
        self._socks: List[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, marker: bytes, mode: str) -> None:
        with self._lock:
            self.stall = mode == "stall"
            self.marker, self.mode = marker, "reply" if mode == "stall" else mode

    def _take(self, data: bytes) -> Optional[str]:
        with self._lock:
            if self.marker is not None and self.marker in data:
                self.marker = None
                return self.mode
        return None

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self._socks += [client, upstream]
            state = {"drop_reply": False}
            threading.Thread(target=self._up, args=(client, upstream, state), daemon=True).start()
            threading.Thread(target=self._down, args=(client, upstream, state), daemon=True).start()

    @staticmethod
    def _close(*socks: socket.socket) -> None:
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def _up(self, client: socket.socket, upstream: socket.socket, state: dict) -> None:
        try:
            while True:
                data = client.recv(65536)
                if not data:
                    break
                mode = self._take(data)
                if mode == "request":
                    self.fired.set()
                    break
                if mode == "reply":
                    state["drop_reply"] = True
                upstream.sendall(data)
        except OSError:
            pass
        self._close(client, upstream)

    def _down(self, client: socket.socket, upstream: socket.socket, state: dict) -> None:
        try:
            while True:
                data = upstream.recv(65536)
                if not data:
                    break
                if state["drop_reply"]:
                    self.fired.set()
                    if self.stall:
                        continue  # the client hears nothing: its read times out
                    break
                client.sendall(data)
        except OSError:
            pass
        self._close(client, upstream)

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        for s in self._socks:
            try:
                s.close()
            except OSError:
                pass


@pytest.fixture
def proxy(server: Server) -> Iterator[Proxy]:
    p = Proxy(server.port)
    yield p
    p.close()


class FakeServer:
    """A scripted RESP server: ``handler(args) -> bytes`` answers each
    request (``args`` as a list of bytes); every request is recorded."""

    def __init__(self, handler: Callable[[List[bytes]], bytes]) -> None:
        self.handler = handler
        self.requests: List[List[bytes]] = []
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", free_port()))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        f = conn.makefile("rb")
        try:
            while True:
                line = f.readline()
                if not line:
                    return
                assert line.startswith(b"*"), line
                args = []
                for _ in range(int(line[1:])):
                    n = int(f.readline()[1:])
                    args.append(f.read(n + 2)[:-2])
                self.requests.append(args)
                name = args[0].upper()
                if name in (b"CLIENT", b"SELECT", b"PING"):
                    conn.sendall(b"+OK\r\n")
                else:
                    conn.sendall(self.handler(args))
        except (OSError, ValueError):
            pass
        finally:
            conn.close()

    def sent(self, command: bytes) -> List[List[bytes]]:
        return [r for r in self.requests if r[0].upper() == command]

    def close(self) -> None:
        self.listener.close()


Addr = Tuple[str, int]
