"""Shared fixtures. Keep this small and generic: helpers live in modules
(``tests/etcd_server.py``)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator

import pytest

from chaos.lab.local_etcd import EtcdServer, etcd_available
from controlplane.kernel.keys import Keys
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.memory import MemoryStore
from controlplane.kernel.store.settings import EtcdConfig


@pytest.fixture(scope="session")
async def etcd() -> AsyncIterator[EtcdServer]:
    """One real single-member etcd for the whole session (tests isolate by key prefix)."""
    if not etcd_available():
        # Fail, never skip: a skipped etcd suite would read as green.
        pytest.fail(
            "the etcd binary is not installed: run scripts/setup.sh (apt-get install etcd-server)"
        )
    server = EtcdServer()
    await asyncio.to_thread(server.start)
    try:
        yield server
    finally:
        await asyncio.to_thread(server.stop)


@pytest.fixture
def cluster_name() -> str:
    """A fresh deployment name, so tests sharing the session etcd never collide."""
    return f"t-{secrets.token_hex(5)}"


@pytest.fixture
def keys(cluster_name: str) -> Keys:
    return Keys(cluster=cluster_name)


@pytest.fixture
async def etcd_store(etcd: EtcdServer) -> AsyncIterator[EtcdStore]:
    """A connected EtcdStore on the session etcd; use ``keys`` / ``cluster_name`` for keys."""
    store = EtcdStore(EtcdConfig(endpoints=etcd.endpoints, request_timeout_s=2.0))
    await store.connect()
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
async def memory_store() -> AsyncIterator[MemoryStore]:
    """A MemoryStore on the real monotonic clock."""
    store = MemoryStore()
    try:
        yield store
    finally:
        await store.close()
