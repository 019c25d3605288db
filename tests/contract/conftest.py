"""Backends for the API contract tests: the simulator and a REAL vLLM (CPU build).

The ``server`` fixture is package-scoped and parametrized, so every test in this
folder runs once against each backend with one server start per backend for the whole
folder (real vLLM: ~20 s, ~2.3 GB RSS); pytest groups the tests by backend, so the
real vLLM is up only while this folder's tests against it run.

Real vLLM comes from ``.venv-vllm`` (``scripts/setup_vllm_cpu.sh``). Its tests carry
the ``realvllm`` marker so that a developer can leave them out locally with
``pytest -m "not realvllm"``. When ``.venv-vllm`` is missing they are skipped locally
but FAIL when ``CI`` is set: CI must never skip them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from chaos.lab.procs import Proc, start_simulator
from chaos.lab.vllm_cpu import SETUP_HINT, start_vllm, vllm_available

SERVED_NAME = "tiny"
MAX_MODEL_LEN = 4096
CPU_BLOCK_SIZE = 128  # vLLM's CPU build; the simulator is started to match
# usage.prompt_tokens_details.cached_tokens: how pre-warm verifies under live traffic
DETAILS = ("--enable-prompt-tokens-details",)


@dataclass(frozen=True)
class Backend:
    name: str  # "simulator" or "vllm"
    url: str
    model: str
    proc: Proc


def _start(kind: str) -> Proc:
    if kind == "simulator":
        return start_simulator(
            model=SERVED_NAME,
            block_size=CPU_BLOCK_SIZE,
            extra_args=["--max-model-len", str(MAX_MODEL_LEN), *DETAILS],
            name="contract-sim",
        )
    if not vllm_available():
        message = f"real vLLM is not installed: {SETUP_HINT}"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the real-vLLM contract tests; {message}")
        pytest.skip(message)
    # ~20 s on an idle 2-core machine, 45-75 s measured while other suites ran.
    return start_vllm(
        served_name=SERVED_NAME,
        max_model_len=MAX_MODEL_LEN,
        timeout=240,
        name="contract-vllm",
        extra_args=DETAILS,
    )


@pytest.fixture(
    scope="package",
    params=["simulator", pytest.param("vllm", marks=pytest.mark.realvllm)],
)
def server(request: pytest.FixtureRequest) -> Iterator[Backend]:
    kind = str(request.param)
    proc = _start(kind)
    try:
        yield Backend(kind, proc.url, SERVED_NAME, proc)
    finally:
        proc.terminate()
