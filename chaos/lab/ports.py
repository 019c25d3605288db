"""Ports for the lab's processes, chosen once and kept across a drill's restarts."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from regions.pool.processes import free_port

LOCALHOST = "127.0.0.1"
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
RESERVED_FLOOR = 20000  # the lowest port reserved_port() hands out


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


def reserved_port(taken: set[int], rng: random.Random | None = None) -> int:
    """A free port for a process started a while after its port is chosen, or started
    again there by a drill (the lab's ports are in the topology and in Envoy's configs):
    below the kernel's ephemeral range, so that no outgoing connection on this machine
    takes it as its source port meanwhile (seen with ports from that range: a picker and
    an agent could not bind their own). Not one in ``taken``, which it joins."""
    rng = rng or random.Random()
    low = _ephemeral_low()
    if low > RESERVED_FLOOR:
        for _ in range(200):
            port = rng.randrange(RESERVED_FLOOR, low)
            if port not in taken and _bindable(port):
                taken.add(port)
                return port
    port = free_port()  # no room below the ephemeral range: the usual way
    taken.add(port)
    return port
