"""Helpers for the simulator's tests (tests/test_simulator*.py): the one-sequence
replica both files use (``small_sim``, module-scoped: started once per file), an HTTP
client, and requests and metrics read over HTTP."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from chaos.lab.procs import Proc, start_simulator, until

JsonObj = dict[str, Any]  # decoded JSON, checked by the asserts


@pytest.fixture(name="small_sim", scope="module")
def fixture_small_sim() -> Iterator[Proc]:
    """One running sequence at a time, slow decode, CPU-like block size."""
    proc = start_simulator(
        block_size=128,
        extra_args=[
            "--max-num-seqs",
            "1",
            "--decode-tokens-per-s",
            "50",
            "--enable-prompt-tokens-details",
        ],
    )
    yield proc
    proc.kill()


@pytest.fixture(name="http")
async def fixture_http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        yield s


async def get_json(http: aiohttp.ClientSession, url: str) -> JsonObj:
    async with http.get(url) as r:
        assert r.status == 200, await r.text()
        body = await r.json()
        assert isinstance(body, dict)
        return body


async def post_json(
    http: aiohttp.ClientSession, url: str, payload: JsonObj, status: int = 200
) -> JsonObj:
    async with http.post(url, json=payload) as r:
        text = await r.text()
        assert r.status == status, text
        body = json.loads(text)
        assert isinstance(body, dict)
        return body


def samples(text: str, name: str) -> list[tuple[str, float]]:
    """(labels, value) of every sample called exactly ``name``."""
    pat = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", re.M)
    return [(m.group(1) or "", float(m.group(2))) for m in pat.finditer(text)]


async def metric(http: aiohttp.ClientSession, sim: Proc, name: str) -> float:
    async with http.get(sim.url + "/metrics") as r:
        return sum(v for _, v in samples(await r.text(), name))


async def wait_metric(http: aiohttp.ClientSession, sim: Proc, name: str, want: float) -> None:
    async def holds() -> bool:
        return await metric(http, sim, name) == want

    await until(holds, what=f"{name} == {want}")


def long_prompt(words: int = 300) -> str:
    tag = uuid.uuid4().hex
    return " ".join(f"{tag[i % 32]}word{i}" for i in range(words))


async def complete(
    http: aiohttp.ClientSession, sim: Proc, prompt: str | list[int], **kw: object
) -> JsonObj:
    return await post_json(
        http,
        sim.url + "/v1/completions",
        {"model": "tiny", "prompt": prompt, "max_tokens": 4, **kw},
    )
