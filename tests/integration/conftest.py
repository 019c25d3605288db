"""Fixtures shared by the integration tests.

``vllm_pair``: two REAL vLLM servers (the CPU build, the tiny model, the same flags),
shared by every test that asks for them (the pre-warm test's regions a and b, the
admission tests' engine) instead of a start per module: a start costs ~20-40 s (45-75 s
measured on a loaded machine) and ~2.3 GB RSS each. So that the servers are up only
while those tests run, their modules run one after the other (moved, whole, to where
the first of them was collected) and the servers stop after the last of them. Each test
gets both servers alive, with an empty prefix cache: one a test killed (the pre-warm
test SIGKILLs ``a``) is started again for the next test that asks.
"""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Iterator

import pytest

from chaos.lab.vllm_cpu import SETUP_HINT, VllmProc, launch_vllm, vllm_available, wait_vllm

PAIR = "vllm_pair"
START_TIMEOUT_S = 300.0


class VllmPair:
    """Two vLLM servers, started on first use, restarted where one has died."""

    def __init__(self) -> None:
        self.procs: list[VllmProc | None] = [None, None]

    def get(self) -> tuple[VllmProc, VllmProc]:
        dead = [i for i, p in enumerate(self.procs) if p is None or not p.alive()]
        for i in dead:
            old = self.procs[i]
            if old is not None:
                old.terminate()  # reaps it and removes its temp dir
            self.procs[i] = launch_vllm(name=f"vllm-{'ab'[i]}")  # launch all, then wait
        for i in dead:
            proc = self.procs[i]
            assert proc is not None
            try:
                wait_vllm(proc, timeout=START_TIMEOUT_S)
            except BaseException:
                self.procs[i] = None  # wait_vllm killed it
                raise
        a, b = self.procs
        assert a is not None and b is not None
        return a, b

    def stop(self) -> None:
        for i, p in enumerate(self.procs):
            if p is not None:
                p.terminate()
            self.procs[i] = None


def _reset_prefix_cache(proc: VllmProc) -> None:
    """vLLM's dev-mode ``/reset_prefix_cache``: no test sees what an earlier one cached."""
    request = urllib.request.Request(proc.url + "/reset_prefix_cache", method="POST")
    with urllib.request.urlopen(request, timeout=30) as r:
        assert r.status == 200, r.status


@pytest.fixture(scope="session")
def _vllm_pair_servers() -> Iterator[VllmPair]:
    pair = VllmPair()
    try:
        yield pair
    finally:
        pair.stop()


@pytest.fixture
def vllm_pair(
    request: pytest.FixtureRequest, _vllm_pair_servers: VllmPair
) -> Iterator[tuple[VllmProc, VllmProc]]:
    """Two live real vLLM servers with empty prefix caches (see the module's docstring)."""
    if not vllm_available():
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the real-vLLM tests; {SETUP_HINT}")
        pytest.skip(f"real vLLM is not installed: {SETUP_HINT}")
    servers = _vllm_pair_servers.get()
    for proc in servers:
        _reset_prefix_cache(proc)
    yield servers
    items = request.session.items
    later = items[items.index(request.node) + 1 :] if request.node in items else []
    if not any(PAIR in getattr(i, "fixturenames", ()) for i in later):
        _vllm_pair_servers.stop()  # the last test that needs them has run


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules whose tests use ``vllm_pair`` run one after the other, where the
    first of them was collected (each module whole, in its own order), so that the
    servers are up only for them."""
    modules = {i.path for i in items if PAIR in getattr(i, "fixturenames", ())}
    if len(modules) < 2:
        return
    moved = [i for i in items if i.path in modules]
    first = items.index(moved[0])
    rest = [i for i in items if i.path not in modules]
    items[:] = [*rest[:first], *moved, *rest[first:]]
