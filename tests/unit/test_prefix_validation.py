"""The prefix tracker's identity, checked against a vLLM-compatible prefix cache's counters.

A simulator runs in this process (real HTTP on 127.0.0.1:0, block sizes 16 like GPU
vLLM and 128 like the CPU build). Two prompts the tracker says share ``k`` full
blocks must raise ``vllm:prefix_cache_hits_total`` by ``k * block_size`` on the
second send (exactly with token blocks; within one block plus the calibration drift
with the character proxy), and a replayed payload must warm what it claims.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import aiohttp
import pytest

from controlplane.kernel.prefix.identity import (
    FingerprintParams,
    PromptRequest,
    calibrate_chars_per_token,
    levels,
    shared_blocks,
)
from controlplane.kernel.prefix.prewarm import PrewarmLimits, Residency
from controlplane.kernel.prefix.tracker import PrefixTracker, TrackerConfig
from regions.simulator.engine import EngineConfig
from regions.simulator.server import SimConfig, serve
from regions.simulator.tokenizer import Tokenizer, render_chat

MODEL = "tiny"
_HITS = re.compile(r"^vllm:prefix_cache_hits_total(?:\{[^}]*\})? (\S+)$", re.M)
_WORDS = [
    "".join(random.Random(i).choice("abcdefghijklmnopqrstuvwxyz") for _ in range(1 + i % 9))
    for i in range(2000)
]


def text(n_words: int, seed: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(_WORDS) + rng.choice("  ,.\n") for _ in range(n_words))


@dataclass
class Sim:
    url: str
    block_size: int
    http: aiohttp.ClientSession

    async def post(self, path: str, body: object = None, data: bytes | None = None) -> object:
        """POST ``body`` as JSON, or ``data`` (a ready JSON body) as it is."""
        headers = {"content-type": "application/json"}
        payload = data if data is not None else json.dumps(body).encode()
        async with self.http.post(self.url + path, data=payload, headers=headers) as r:
            assert r.status == 200, await r.text()
            return await r.json()

    async def hits(self) -> int:
        async with self.http.get(self.url + "/metrics") as r:
            return int(sum(float(v) for v in _HITS.findall(await r.text())))

    async def reset(self) -> None:
        await self.post("/reset_prefix_cache")

    async def complete(self, prompt: str | Sequence[int], salt: str | None = None) -> int:
        """Send a prompt; the hit tokens it got."""
        before = await self.hits()
        body: dict[str, object] = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
        if salt is not None:
            body["cache_salt"] = salt
        await self.post("/v1/completions", body)
        return await self.hits() - before

    async def chat(self, messages: Sequence[tuple[str, str]]) -> int:
        before = await self.hits()
        msgs = [{"role": r, "content": c} for r, c in messages]
        await self.post("/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 1})
        return await self.hits() - before


@pytest.fixture(scope="module", params=[16, 128], ids=["block16", "block128"])
async def sim(request: pytest.FixtureRequest) -> AsyncIterator[Sim]:
    block = int(request.param)
    engine = EngineConfig(
        model=MODEL,
        block_size=block,
        num_blocks=50_000,
        max_model_len=16_384,
        prefill_tokens_per_s=1e9,
        decode_tokens_per_s=1e6,
    )
    runner, _, port = await serve(SimConfig(engine=engine), "127.0.0.1", 0)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        yield Sim(f"http://127.0.0.1:{port}", block, http)
    await runner.cleanup()


def simulator_tokenize(request: PromptRequest) -> list[int]:
    """The served model's tokenizer, as a tracker on a gateway with a tokenizer uses it."""
    tok = Tokenizer()
    if request.messages is not None:
        return tok.encode(render_chat(request.messages, add_generation_prompt=True))
    return tok.encode(request.prompt or "")


def tracker(
    block: int, *, cpt: float = 4.0, level_blocks: int = 1, exact: bool = False, k: int = 1
) -> PrefixTracker:
    params = FingerprintParams(
        block_size=block, chars_per_token=cpt, level_tokens=block * level_blocks
    )
    cfg = TrackerConfig(params=params, model=MODEL, min_sessions=k)
    return PrefixTracker(cfg, tokenize=simulator_tokenize if exact else None)


def tracker_shared_blocks(t: PrefixTracker, a: PromptRequest, b: PromptRequest) -> int:
    """What the tracker says two requests share: their levels it counted twice."""
    t.observe_request("r", "s-a", a)
    t.observe_request("r", "s-b", b)
    ids = simulator_tokenize(a) if t._tokenize else None
    chain = levels(a, t.params, ids)
    twice = [lv.blocks for lv in chain if t.estimate("r", lv.key) >= 2]
    return max(twice, default=0)


SHARED_WORDS = [0, 3, 40, 150, 333, 700]


async def test_token_blocks_predict_hits_exactly(sim: Sim) -> None:
    for i, n in enumerate(SHARED_WORDS):
        shared = text(n, seed=i)
        a = PromptRequest(MODEL, prompt=shared + "Alpha " + text(300, seed=100 + i))
        b = PromptRequest(MODEL, prompt=shared + "Omega " + text(300, seed=200 + i))
        k = tracker_shared_blocks(tracker(sim.block_size, exact=True), a, b)
        p = FingerprintParams(block_size=sim.block_size, level_tokens=sim.block_size)
        ids_a, ids_b = simulator_tokenize(a), simulator_tokenize(b)
        assert k == shared_blocks(levels(a, p, ids_a), levels(b, p, ids_b))
        await sim.reset()
        assert await sim.complete(a.prompt or "") == 0
        assert await sim.complete(b.prompt or "") == k * sim.block_size, f"{n} shared words"


async def test_token_blocks_of_chats_predict_hits_exactly(sim: Sim) -> None:
    system = ("system", text(500, seed=7))
    for i in range(3):
        a = PromptRequest(MODEL, messages=[system, ("user", f"q{i} " + text(50, seed=i))])
        b = PromptRequest(MODEL, messages=[system, ("user", f"Q{i} " + text(50, seed=i))])
        k = tracker_shared_blocks(tracker(sim.block_size, exact=True), a, b)
        assert k > 0
        await sim.reset()
        await sim.chat(a.messages or [])
        assert await sim.chat(b.messages or []) == k * sim.block_size


async def calibrated(sim: Sim) -> float:
    sample = text(3000, seed=99)
    answer = await sim.post("/tokenize", {"model": MODEL, "prompt": sample})
    assert isinstance(answer, dict)
    return calibrate_chars_per_token(sample, int(answer["count"]))


def proxy_tolerance(claimed: int, block: int) -> float:
    """One block (cuts fall mid-token) plus 3 % calibration drift."""
    return block + 0.03 * claimed


async def test_character_proxy_predicts_hits_within_a_block_and_drift(sim: Sim) -> None:
    cpt = await calibrated(sim)
    errors = []
    for i, n in enumerate([*SHARED_WORDS, 55, 222, 480, 999]):
        shared = text(n, seed=i)
        a = PromptRequest(MODEL, prompt=shared + "Alpha " + text(300, seed=300 + i))
        b = PromptRequest(MODEL, prompt=shared + "Omega " + text(300, seed=400 + i))
        k = tracker_shared_blocks(tracker(sim.block_size, cpt=cpt), a, b)
        await sim.reset()
        await sim.complete(a.prompt or "")
        hits = await sim.complete(b.prompt or "")
        claimed = k * sim.block_size
        errors.append(hits - claimed)
        assert abs(hits - claimed) <= proxy_tolerance(claimed, sim.block_size), (n, hits, claimed)
    assert max(errors) - min(errors) <= 4 * sim.block_size, errors


async def prewarm_then_hit(
    sim: Sim, t: PrefixTracker, fresh: PromptRequest, salt: str | None = None
) -> tuple[int, int]:
    """Leader side: merge the gateway's export, pick the top prefix, replay it on a
    cleared target; then the hit tokens of a fresh request sharing it, and the
    tokens the payload claimed."""
    leader = PrefixTracker(t.config)
    leader.merge(t.export())
    limits = PrewarmLimits(prefill_tokens_per_s=20_000, kv_capacity_blocks=10_000, block_size=16)
    residency = Residency(min_sessions=t.config.min_sessions, source_zone="us", target_zone="us")
    sel = leader.top("r", 1, limits, residency)
    assert len(sel.replay) == 1, sel
    (payload,) = sel.replay
    await sim.reset()
    await sim.post(payload.endpoint, data=payload.request_body())
    if fresh.messages is not None:
        return await sim.chat(fresh.messages), payload.tokens
    return await sim.complete(fresh.prompt or "", salt), payload.tokens


async def test_replayed_text_payload_warms_what_it_claims(sim: Sim) -> None:
    cpt = await calibrated(sim)
    system = text(1200, seed=11)
    t = tracker(sim.block_size, cpt=cpt, level_blocks=max(1, 256 // sim.block_size), k=3)
    for s in range(6):
        t.observe("r", f"session-{s}", system + f"Question {s}: " + text(40, seed=500 + s))
    fresh = PromptRequest(MODEL, prompt=system + "Another question: " + text(40, seed=600))
    hits, claimed = await prewarm_then_hit(sim, t, fresh)
    assert claimed >= 1024 and hits > 0
    assert abs(hits - claimed) <= proxy_tolerance(claimed, sim.block_size), (hits, claimed)


async def test_replayed_token_payload_warms_exactly_and_keeps_its_salt(sim: Sim) -> None:
    system = text(800, seed=12)
    t = tracker(sim.block_size, exact=True, k=2)
    for s in range(4):
        req = PromptRequest(MODEL, prompt=system + f"Q{s} " + text(30, seed=700 + s))
        t.observe_request("r", f"session-{s}", dataclasses.replace(req, cache_salt="t1"))
    fresh = PromptRequest(MODEL, prompt=system + "Q9 " + text(30, seed=800))
    hits, claimed = await prewarm_then_hit(sim, t, fresh, salt="t1")
    assert hits == claimed > 0
    assert await sim.complete(fresh.prompt or "", salt="t2") == 0  # another tenant's cache
    assert await sim.complete(fresh.prompt or "") == 0


async def test_replayed_chat_payload_warms_what_it_claims(sim: Sim) -> None:
    cpt = await calibrated(sim)
    system = ("system", text(900, seed=13))
    t = tracker(sim.block_size, cpt=cpt, level_blocks=max(1, 128 // sim.block_size), k=3)
    for s in range(5):
        t.observe_request(
            "r", f"s{s}", PromptRequest(MODEL, messages=[system, ("user", text(30, seed=900 + s))])
        )
    fresh = PromptRequest(MODEL, messages=[system, ("user", "What now? " + text(30, seed=950))])
    hits, claimed = await prewarm_then_hit(sim, t, fresh)
    assert claimed > 0 and hits > 0
    assert abs(hits - claimed) <= proxy_tolerance(claimed, sim.block_size), (hits, claimed)
