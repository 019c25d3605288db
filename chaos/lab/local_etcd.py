"""Real etcd processes for tests: one member (``EtcdServer``) or a cluster (``EtcdCluster``).

Not a test module. Members listen on free loopback ports with a temporary data dir,
fast raft timings and no fsync (tests only), and log to a file in their data dir so
that a failing test can show why. Methods are synchronous (subprocess + HTTP polling);
from async code call the slow ones (``start``, ``restart_member``) via
``asyncio.to_thread`` so that keep-alives in the same loop keep running.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

from chaos.lab.ports import reserved_port

ETCD_BINARY = "etcd"
# Fast elections so that losing a member costs ~0.1-2 s, not the default 1-10 s.
FAST_FLAGS = (
    "--logger=zap",
    "--log-level=warn",
    "--heartbeat-interval=10",
    "--election-timeout=100",
    "--unsafe-no-fsync",
    # etcd's own compaction as a backstop, as shipped configurations have it
    # (docs/etcd.md): longer than Tectonic's 5 minutes, so the leader's compaction is
    # what a lab exercises; it first runs 10 minutes in.
    "--auto-compaction-mode=periodic",
    "--auto-compaction-retention=10m",
    # 512 MiB: far above what a lab writes in 10 minutes, far below the 2 GiB default,
    # so a history that is never compacted shows up in a long lab, not on a shared disk.
    # A member's extra_flags come later and win (etcd keeps a repeated flag's last).
    "--quota-backend-bytes=536870912",
)


def etcd_available() -> bool:
    return shutil.which(ETCD_BINARY) is not None


def _healthy(client_port: int) -> bool:
    """True once the member answers ``/health`` with a leader (quorum) behind it."""
    url = f"http://127.0.0.1:{client_port}/health"
    try:
        with urllib.request.urlopen(url, timeout=0.5) as resp:
            body = json.loads(resp.read())
    except (OSError, ValueError, urllib.error.URLError):
        return False
    return str(body.get("health")) == "true"


@dataclass
class _Member:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    proc: subprocess.Popen[bytes] | None = None
    extra_flags: tuple[str, ...] = ()  # e.g. a small --quota-backend-bytes
    # the peer port the others are told to dial, e.g. a latency proxy's in front of
    # peer_port (chaos/lab/latency_proxy.py); 0: peer_port itself
    advertised_peer_port: int = 0
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.data_dir.with_suffix(".log")

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def advertised_peer_url(self) -> str:
        return f"http://127.0.0.1:{self.advertised_peer_port or self.peer_port}"

    def spawn(self, initial_cluster: str, token: str, state: str) -> None:
        client_url = f"http://{self.endpoint}"
        args = [
            ETCD_BINARY,
            f"--name={self.name}",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={self.peer_url}",
            f"--initial-advertise-peer-urls={self.advertised_peer_url}",
            f"--initial-cluster={initial_cluster}",
            f"--initial-cluster-token={token}",
            f"--initial-cluster-state={state}",
            *FAST_FLAGS,
            *self.extra_flags,
        ]
        if shutil.which("setpriv"):
            # If the test process dies hard (SIGKILL, OOM), take etcd down with it.
            # The kernel ties this to the spawning *thread*: spawn from the main thread
            # or a pool thread (asyncio.to_thread), not a short-lived thread.
            args = ["setpriv", "--pdeathsig", "KILL", *args]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class EtcdCluster:
    """``n`` etcd members on loopback. ``start()`` waits until every member is healthy;
    ``stop()`` kills them all and removes the data dirs (also on ``__exit__``)."""

    def __init__(
        self,
        n: int = 3,
        *,
        start_timeout_s: float = 20.0,
        extra_flags: tuple[str, ...] = (),
        proxied_peers: bool = False,
    ) -> None:
        """``extra_flags`` go to every member after the fast test flags. With
        ``proxied_peers`` each member advertises a second port of its own to its peers
        (``peer_routes``: the caller forwards it to the member's peer port, e.g. through
        a latency proxy, before ``start``), so that every peer message crosses it."""
        if n < 1:
            raise ValueError("a cluster needs at least one member")
        self._tmp = Path(tempfile.mkdtemp(prefix="tectonic-etcd-"))
        self._token = self._tmp.name
        self._timeout = start_timeout_s
        # Ports below the kernel's ephemeral range: a member is started a while after its
        # port is chosen, and again on it after a kill; meanwhile no outgoing connection
        # of this machine (another test's, on another worker) may take it as its source
        taken: set[int] = set()
        self.members = [
            _Member(
                f"m{i}",
                reserved_port(taken),
                reserved_port(taken),
                self._tmp / f"m{i}",
                None,
                extra_flags,
                reserved_port(taken) if proxied_peers else 0,
            )
            for i in range(n)
        ]
        self._initial_cluster = ",".join(f"{m.name}={m.advertised_peer_url}" for m in self.members)
        self._started = False

    @property
    def endpoints(self) -> tuple[str, ...]:
        """``host:port`` of every member's client URL, as ``EtcdConfig.endpoints`` wants."""
        return tuple(m.endpoint for m in self.members)

    @property
    def peer_routes(self) -> tuple[tuple[int, int], ...]:
        """(advertised port, peer port) of each member built with ``proxied_peers``:
        what the caller must forward for the members to reach each other."""
        return tuple(
            (m.advertised_peer_port, m.peer_port) for m in self.members if m.advertised_peer_port
        )

    def start(self) -> Self:
        try:
            for m in self.members:
                m.spawn(self._initial_cluster, self._token, "new")
            self._started = True
            self._wait_healthy(self.members)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for m in self.members:
            m.kill()
        shutil.rmtree(self._tmp, ignore_errors=True)
        self._started = False

    def kill_member(self, i: int) -> None:
        """SIGKILL member ``i`` (no graceful leave; its data dir stays for a restart)."""
        self.members[i].kill(signal.SIGKILL)

    def restart_member(self, i: int) -> None:
        """Start member ``i`` again from its data dir and wait until it is healthy."""
        m = self.members[i]
        m.kill()
        # An existing data dir makes etcd ignore --initial-cluster-state; "existing"
        # is right for a wiped one too.
        state = "existing" if m.data_dir.exists() else "new"
        m.spawn(self._initial_cluster, self._token, state)
        self._wait_healthy([m])

    def leader_index(self) -> int | None:
        """Index of the member that is raft leader (from its ``/metrics``), or None when
        none can be told (e.g. during an election)."""
        for i, m in enumerate(self.members):
            if not m.running():
                continue
            try:
                with urllib.request.urlopen(f"http://{m.endpoint}/metrics", timeout=0.5) as r:
                    text = r.read().decode()
            except OSError:
                continue
            if re.search(r"^etcd_server_is_leader 1$", text, re.MULTILINE):
                return i
        return None

    def _wait_healthy(self, members: list[_Member]) -> None:
        deadline = time.monotonic() + self._timeout
        pending = list(members)
        while pending:
            for m in list(pending):
                if not m.running():
                    raise RuntimeError(f"etcd {m.name} exited:\n{m.log_tail()}")
                if _healthy(m.client_port):
                    pending.remove(m)
            if not pending:
                return
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {m.name}\n{m.log_tail()}" for m in pending)
                raise TimeoutError(f"etcd not healthy after {self._timeout:g}s:\n{tails}")
            time.sleep(0.05)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __del__(self) -> None:
        # Last resort so that no etcd outlives the test session.
        with contextlib.suppress(Exception):
            if self._started:
                self.stop()


class EtcdServer(EtcdCluster):
    """A single etcd member."""

    def __init__(self, *, start_timeout_s: float = 20.0, extra_flags: tuple[str, ...] = ()) -> None:
        super().__init__(1, start_timeout_s=start_timeout_s, extra_flags=extra_flags)

    @property
    def endpoint(self) -> str:
        return self.members[0].endpoint

    def kill(self) -> None:
        self.kill_member(0)

    def restart(self) -> None:
        self.restart_member(0)
