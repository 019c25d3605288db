"""Ports for the lab's processes, chosen once and kept across a drill's restarts."""

from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

from regions.pool.processes import free_port

LOCALHOST = "127.0.0.1"
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
RESERVED_FLOOR = 20000  # the lowest port reserved_port() hands out
# One lock file per port handed out, flock()ed by the process that chose it for as long
# as it lives (or until it has chosen HELD_MAX more): labs started side by side by other
# processes (two test workers, a demo beside a drill) skip those ports, though nothing
# listens on them yet. The kernel drops a dead process's locks, kill -9 included.
CLAIMS = Path(tempfile.gettempdir()) / "tectonic-ports"
HELD_MAX = 512
_held: OrderedDict[int, int] = OrderedDict()  # port -> the fd holding its lock
_held_lock = threading.Lock()


def _ephemeral_low() -> int:
    """The first port the kernel gives outgoing connections (32768 if unreadable)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((LOCALHOST, port))
        except OSError:
            return False
    return True


def _claim(port: int) -> bool:
    """Lock ``port``'s file for this process; False when another process holds it."""
    with _held_lock:
        if port in _held:
            return False
        try:
            CLAIMS.mkdir(mode=0o777, exist_ok=True)
            fd = os.open(CLAIMS / str(port), os.O_CREAT | os.O_RDWR, 0o666)
        except OSError:  # no claims here (a read-only or foreign temp dir): bindable will do
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        _held[port] = fd
        while len(_held) > HELD_MAX:  # the oldest claims: their labs are long gone
            os.close(_held.popitem(last=False)[1])
        return True


def reserved_port(taken: set[int], rng: random.Random | None = None) -> int:
    """A free port for a process started a while after its port is chosen, or started
    again there by a drill (the lab's ports are in the topology and in Envoy's configs):
    below the kernel's ephemeral range, so that no outgoing connection on this machine
    takes it as its source port meanwhile (seen with ports from that range: a picker and
    an agent could not bind their own), and claimed for this process (``_claim``) so
    that no lab of another process chooses it too (seen: a demo's control plane and a
    drill's process beside it, both on one). Not one in ``taken``, which it joins."""
    rng = rng or random.Random()
    low = _ephemeral_low()
    if low > RESERVED_FLOOR:
        for _ in range(200):
            port = rng.randrange(RESERVED_FLOOR, low)
            if port not in taken and _bindable(port) and _claim(port):
                taken.add(port)
                return port
    port = free_port()  # no room below the ephemeral range: the usual way
    taken.add(port)
    return port
