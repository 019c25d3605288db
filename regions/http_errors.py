"""An aiohttp failure in a few words an operator can act on."""

from __future__ import annotations

import errno

import aiohttp


def describe_error(exc: BaseException, timeout: float) -> str:
    """A short reason for an operator: ``connection refused``, ``timeout after 0.5s``..."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        if exc.os_error.errno == errno.ECONNREFUSED:
            return "connection refused"
        return f"cannot connect: {exc.os_error.strerror or exc.os_error}"
    if isinstance(exc, TimeoutError):
        return f"timeout after {timeout:g}s"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "server disconnected"
    return f"{type(exc).__name__}: {exc}".strip()
