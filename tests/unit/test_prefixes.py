"""Prefix identity, residency, sketch merge and the pre-warm choice (no I/O)."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.kernel.prefix.identity import (
    FingerprintParams,
    PromptKind,
    PromptRequest,
    block_chain_text,
    block_chain_tokens,
    fingerprint,
    levels,
    render_chat,
    shared_blocks,
)
from controlplane.kernel.prefix.prewarm import (
    Candidate,
    PrewarmLimits,
    ReplayPayload,
    Residency,
    SkipReason,
    merge_sessions,
    replay_payload,
    select_prewarm,
    top_n,
)
from controlplane.kernel.prefix.tracker import PrefixTracker, TrackerConfig, TrackerExport

B = 16
PARAMS = FingerprintParams(block_size=B, chars_per_token=4.0, level_tokens=B)  # every block
US = Residency(min_sessions=3, source_zone="us", target_zone="us")
ROOMY = PrewarmLimits(prefill_tokens_per_s=10_000, kv_capacity_blocks=100_000, block_size=B)


def words(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(10**6)}" for _ in range(n))


# ---- fingerprints -----------------------------------------------------------------------


@given(
    st.lists(st.integers(0, 50_000), min_size=0, max_size=200),
    st.lists(st.integers(0, 50_000), min_size=1, max_size=80),
    st.lists(st.integers(0, 50_000), min_size=1, max_size=80),
)
@settings(max_examples=60, deadline=None)
def test_token_chains_agree_exactly_up_to_the_first_differing_block(
    shared: list[int], a: list[int], b: list[int]
) -> None:
    if a[0] == b[0]:
        b = [a[0] + 1, *b[1:]]
    ca, cb = block_chain_tokens(shared + a, B), block_chain_tokens(shared + b, B)
    k = len(shared) // B  # blocks that lie entirely in the shared tokens
    assert shared_blocks(ca, cb) == k
    assert [lv.key for lv in ca[:k]] == [lv.key for lv in cb[:k]]
    if len(ca) > k and len(cb) > k:
        assert ca[k].key != cb[k].key  # and every later block differs (it is a chain)


def test_same_prefix_same_id_and_partial_blocks_are_ignored() -> None:
    ids = list(range(1000, 1000 + 5 * B + 7))  # 5 full blocks and 7 tokens
    req = PromptRequest("tiny", token_ids=ids)
    fp = fingerprint(req, PARAMS)
    assert (fp.blocks, fp.tokens) == (5, 5 * B)
    longer = PromptRequest("tiny", token_ids=[*ids, 1, 2, 3])  # still inside block 6
    assert fingerprint(longer, PARAMS) == fp
    shorter = PromptRequest("tiny", token_ids=ids[: 5 * B])
    assert fingerprint(shorter, PARAMS) == fp
    assert fingerprint(PromptRequest("tiny", token_ids=ids[: B - 1]), PARAMS).key == ""


def test_model_lora_and_cache_salt_are_part_of_the_identity() -> None:
    ids = list(range(4 * B))
    base = fingerprint(PromptRequest("tiny", token_ids=ids), PARAMS).key
    for other in (
        PromptRequest("other", token_ids=ids),
        PromptRequest("tiny", token_ids=ids, lora="sql"),
        PromptRequest("tiny", token_ids=ids, cache_salt="tenant-a"),
    ):
        assert fingerprint(other, PARAMS).key != base


def test_keys_do_not_depend_on_the_level_stride() -> None:
    ids = list(range(20 * B))
    every = {lv.blocks: lv.key for lv in block_chain_tokens(ids, B)}
    coarse = block_chain_tokens(ids, B, stride=8)
    assert [lv.blocks for lv in coarse] == [8, 16, 20]  # and the longest prefix last
    assert all(every[lv.blocks] == lv.key for lv in coarse)
    counted = levels(PromptRequest("m", token_ids=ids), PARAMS, stride=8)
    assert [lv.blocks for lv in counted] == [8, 16]  # the tracker skips the partial level


def test_character_proxy_cuts_text_in_blocks_of_block_size_times_ratio() -> None:
    text = words(400, seed=1)
    cpb = PARAMS.chars_per_block
    assert cpb == 64
    chain = block_chain_text(text, cpb)
    assert len(chain) == len(text) // cpb
    other = text[: 10 * cpb + 5] + "!" + text[10 * cpb + 6 :]
    assert shared_blocks(chain, block_chain_text(other, cpb)) == 10
    fp = fingerprint(PromptRequest("m", prompt=text), PARAMS)
    assert (fp.blocks, fp.tokens) == (len(text) // cpb, len(text) // cpb * B)
    # a chat and a completion with the same text are different prompts for vLLM
    chat = PromptRequest("m", messages=[("user", text)])
    assert (
        fingerprint(chat, PARAMS).key
        != fingerprint(PromptRequest("m", prompt=render_chat([("user", text)])), PARAMS).key
    )


# ---- replay payloads ------------------------------------------------------------------


def test_payloads_reproduce_the_prefix_byte_for_byte() -> None:
    text = words(300, seed=2)
    req = PromptRequest("tiny", prompt=text, lora="sql", cache_salt="salt-1")
    lv = levels(req, PARAMS)[9]
    p = replay_payload(req, lv, PARAMS)
    assert p.kind is PromptKind.TEXT and p.prompt == text[: 10 * 64]
    assert (p.tokens, p.tokens_exact, p.block_size) == (10 * B, False, B)
    body = json.loads(p.request_body())
    assert body == {"model": "sql", "prompt": text[:640], "max_tokens": 1, "cache_salt": "salt-1"}
    assert p.endpoint == "/v1/completions"

    ids = list(range(7, 7 + 6 * B))
    by_ids = PromptRequest("tiny", token_ids=ids)
    fourth = levels(by_ids, PARAMS)[3]
    t = replay_payload(by_ids, fourth, PARAMS)
    assert fourth.blocks == 4 and t.token_ids == tuple(ids[: 4 * B]) and t.tokens_exact

    msgs = [("system", "You are terse. " * 5), ("user", words(100, seed=3))]
    chat = PromptRequest("tiny", messages=msgs)
    chain = levels(chat, PARAMS)
    c = replay_payload(chat, chain[4], PARAMS)  # 5 proxy blocks: 320 characters
    assert c.messages is not None and c.endpoint == "/v1/chat/completions"
    rendered = render_chat((m.role, m.content) for m in c.messages)
    assert render_chat(msgs).startswith(rendered.removesuffix("\n"))
    assert len(rendered.removesuffix("\n")) == 320  # the cut falls in the user message
    assert [m.role for m in c.messages] == ["system", "user"]


def test_a_payload_carries_exactly_its_own_prompt() -> None:
    with pytest.raises(ValueError, match="exactly its own prompt"):
        ReplayPayload(
            key="k",
            kind=PromptKind.TEXT,
            model="m",
            token_ids=(1,),
            blocks=1,
            block_size=B,
            tokens=B,
            tokens_exact=True,
        )


# ---- residency ---------------------------------------------------------------------------


def _tracker(**kw: object) -> PrefixTracker:
    return PrefixTracker(TrackerConfig(params=PARAMS, model="tiny", **kw))  # type: ignore[arg-type]


def _payload_keys(blob: bytes, region: str = "east") -> dict[str, int]:
    exp = TrackerExport.model_validate_json(blob)
    (r,) = [r for r in exp.regions if r.region == region]
    return {e.key: len(e.sessions) for e in r.entries if e.payload is not None}


def test_a_prefix_seen_by_fewer_than_k_sessions_is_never_exported() -> None:
    t = _tracker(min_sessions=3)
    prompt = words(200, seed=4)
    key = levels(PromptRequest("tiny", prompt=prompt), PARAMS)[0].key
    for _ in range(50):  # many requests, but one session and sessionless ones
        t.observe("east", "s1", prompt)
        t.observe("east", "", prompt)
    t.observe("east", "s2", prompt)
    assert t.estimate("east", key) == 101
    assert _payload_keys(t.export()) == {}
    assert "s1" not in t.export().decode()  # session ids never leave, only keyed hashes
    sel = t.top("east", 10, ROOMY, US)
    assert sel.replay == () and sel.skipped == {SkipReason.FEW_SESSIONS: 10}
    t.observe("east", "s3", prompt)
    exported = _payload_keys(t.export())
    assert key in exported and exported[key] == 3
    sel = t.top("east", 10, ROOMY, US)  # equally frequent: the deepest covers the rest
    deepest = levels(PromptRequest("tiny", prompt=prompt), PARAMS)[-1]
    assert [p.prompt for p in sel.replay] == [prompt[: deepest.blocks * 64]]
    assert sel.skipped == {SkipReason.COVERED: 9}


def test_never_into_another_residency_zone() -> None:
    t = _tracker()
    prompt = words(200, seed=5)
    for s in range(10):
        t.observe("east", f"s{s}", prompt)
    to_eu = Residency(min_sessions=3, source_zone="us", target_zone="eu")
    sel = t.top("east", 5, ROOMY, to_eu)
    assert sel.replay == () and sel.skipped == {SkipReason.OTHER_ZONE: 5}
    assert len(t.top("east", 5, ROOMY, US).replay) == 1  # the deepest level covers the rest


def test_sessions_are_capped_and_merge_as_a_capped_union() -> None:
    assert merge_sessions({"a", "b"}, {"b", "c", "d"}, 3) == {"a", "b", "c"}
    t = _tracker(min_sessions=2)
    prompt = words(200, seed=6)
    for s in range(100):
        t.observe("east", f"s{s}", prompt)
    key = levels(PromptRequest("tiny", prompt=prompt), PARAMS)[0].key
    entry = t.entry("east", key)
    assert entry is not None and entry[1] == 2


def test_residency_threshold_above_what_the_tracker_counts_is_refused() -> None:
    with pytest.raises(ValueError, match="counts at most 3"):
        _tracker().top(
            "east", 1, ROOMY, Residency(min_sessions=5, source_zone="u", target_zone="u")
        )


# ---- merge ---------------------------------------------------------------------------------


def test_merged_sketch_counts_the_union_within_its_error_bound() -> None:
    rng = random.Random(7)
    prompts = [words(40, seed=100 + i) for i in range(3000)]  # 3000 distinct, 1 level each
    weights = [1 / (i + 1) ** 1.1 for i in range(len(prompts))]
    cfg = {"lg_max_map_size": 6, "distinct_lg_k": 6, "max_payloads": 16}  # tiny: it must purge
    gateways = [_tracker(**cfg), _tracker(**cfg)]
    exact: Counter[str] = Counter()
    for n in range(12_000):
        p = rng.choices(prompts, weights)[0]
        gateways[n % 2].observe("east", f"s{n % 97}", p)
        exact.update(lv.key for lv in levels(PromptRequest("tiny", prompt=p), PARAMS))
    leader = _tracker(**cfg)
    for g in gateways:
        leader.merge(g.export())
    ranked = leader.ranked("east")
    assert ranked, "the merged sketch tracks keys"
    total = sum(exact.values())
    eps = 3.5 / 2**6  # the frequent-items a-priori error for lg_max_map_size 6
    for key, est, lower, upper in ranked:
        assert lower <= exact[key] <= upper
        assert abs(est - exact[key]) <= eps * total
    for key, count in exact.items():  # no false negatives above the error bound
        if count > eps * total:
            assert key in {r[0] for r in ranked}
    top_counts = [c for _, c in exact.most_common(5)]  # (a prompt's levels tie)
    assert sorted((exact[r[0]] for r in ranked[:5]), reverse=True) == top_counts
    assert leader.sketch_bytes("east") < 48 * 24 + 64 * 16 + 200  # keys, sample, headers
    assert all(len(g._regions["east"].entries) <= 16 for g in gateways)  # bounded payloads


def test_sessions_from_two_gateways_add_up_at_the_leader() -> None:
    prompt = words(200, seed=8)
    a, b, leader = _tracker(), _tracker(), _tracker()
    for s in ("s1", "s2", "s3", "s4"):  # counted from the 2nd sighting on: s2, s3, s4
        a.observe("east", s, prompt)
    for s in ("s3", "s4"):
        b.observe("east", s, prompt)
        b.observe("east", s, prompt)
    leader.merge(b.export())  # b saw two sessions: counts and hashes, no payload
    key = levels(PromptRequest("tiny", prompt=prompt), PARAMS)[0].key
    assert leader.entry("east", key) == (None, 2)
    assert leader.top("east", 1, ROOMY, US).skipped == {SkipReason.FEW_SESSIONS: 1}
    leader.merge(a.export())
    payload, sessions = leader.entry("east", key) or (None, 0)
    assert sessions == 3 and payload is not None and payload.key == key
    assert leader.estimate("east", key) == 8


def test_merge_refuses_a_tracker_cut_differently() -> None:
    other = PrefixTracker(TrackerConfig(params=FingerprintParams(block_size=128)))
    other.observe("east", "s", words(300, seed=9))
    with pytest.raises(ValueError, match="cannot merge"):
        _tracker().merge(other.export())


def test_a_malformed_export_is_refused_and_changes_nothing() -> None:
    t = _tracker()
    t.observe("east", "s", words(300, seed=10))
    blob = json.loads(t.export())
    blob["regions"][0]["sketch"] = "AAAA"  # base64 of 3 bytes: not a sketch
    leader = _tracker()
    for bad in (json.dumps(blob).encode(), b"{", b'{"params": 1}'):
        with pytest.raises(ValueError):
            leader.merge(bad)
    assert leader.regions == ()


def test_observe_never_raises() -> None:
    t = _tracker()
    t.observe_request("east", "s", PromptRequest("tiny", token_ids=[-(2**70)] * 40))
    t.observe_request("east", "s", PromptRequest("tiny"))  # no prompt at all
    assert t.errors == 2


# ---- the choice ---------------------------------------------------------------------------


def _payload(key: str, blocks: int, ancestors: tuple[str, ...] = ()) -> ReplayPayload:
    return ReplayPayload(
        key=key,
        kind=PromptKind.TOKENS,
        model="m",
        token_ids=tuple(range(blocks * B)),
        blocks=blocks,
        block_size=B,
        tokens=blocks * B,
        tokens_exact=True,
        ancestors=ancestors,
    )


def test_top_n_is_a_count_or_a_fraction_rounded_up() -> None:
    assert (top_n(5, 1000), top_n(0.01, 1000), top_n(0.01, 1001), top_n(0.01, 0)) == (5, 10, 11, 0)
    with pytest.raises(ValueError):
        top_n(1.5, 10)


@given(
    st.lists(st.tuples(st.integers(1, 10_000), st.integers(1, 64)), min_size=1, max_size=60),
    st.floats(0.01, 5.0),
    st.integers(0, 2_000),
    st.integers(1, 60),
)
@settings(max_examples=80, deadline=None)
def test_selection_respects_budget_and_kv_capacity(
    items: list[tuple[int, int]], budget_s: float, kv_blocks: int, n: int
) -> None:
    limits = PrewarmLimits(
        budget_s=budget_s, prefill_tokens_per_s=1_000, kv_capacity_blocks=kv_blocks, block_size=B
    )
    cands = [
        Candidate(key=f"k{i}", count=c, sessions=3, payload=_payload(f"k{i}", blocks))
        for i, (c, blocks) in enumerate(items)
    ]
    sel = select_prewarm(cands, n, limits, US)
    assert sel.prefill_tokens <= limits.budget_tokens and sel.kv_blocks <= kv_blocks
    assert sel.prefill_tokens == sum(p.tokens for p in sel.replay)  # no shared ancestors here
    assert sel.considered == min(n, len(cands))
    assert len(sel.replay) + sum(sel.skipped.values()) == sel.considered
    chosen = {p.key for p in sel.replay}
    considered = sorted(cands, key=lambda c: (-c.count, -(c.payload.blocks if c.payload else 0)))
    assert chosen <= {c.key for c in considered[:n]}  # only the top n, never below them


def test_selection_prefers_frequent_prefixes_and_counts_shared_ancestors_once() -> None:
    root = _payload("root", 4)
    deep = _payload("deep", 10, ancestors=("root",))
    other = _payload("other", 8)
    cands = [
        Candidate(key="deep", count=50, sessions=3, payload=deep),
        Candidate(key="root", count=90, sessions=3, payload=root),
        Candidate(key="other", count=40, sessions=3, payload=other),
        Candidate(key="rare", count=1, sessions=3, payload=_payload("rare", 1)),
        Candidate(key="nopay", count=80, sessions=3, payload=None),
        Candidate(key="private", count=85, sessions=2, payload=_payload("private", 1)),
    ]
    sel = select_prewarm(cands, 5, ROOMY, US)
    assert [p.key for p in sel.replay] == ["deep", "other"]  # root is warmed by deep's replay
    assert sel.prefill_tokens == (10 + 8) * B and sel.kv_blocks == 18
    assert sel.skipped == {SkipReason.NO_PAYLOAD: 1, SkipReason.FEW_SESSIONS: 1}
    tight = ROOMY.model_copy(update={"budget_s": 12 * B / ROOMY.prefill_tokens_per_s})
    sel = select_prewarm(cands, 5, tight, US)  # 12 blocks of budget: root, deep's 6 extra
    assert [p.key for p in sel.replay] == ["deep"] and sel.prefill_tokens == 10 * B
    assert sel.skipped[SkipReason.BUDGET] == 1
    small_kv = ROOMY.model_copy(update={"kv_capacity_blocks": 9})
    sel = select_prewarm(cands, 5, small_kv, US)
    assert [p.key for p in sel.replay] == ["root"]  # deep's 6 more and other's 8 do not fit
    assert sel.kv_blocks == 4 and sel.skipped[SkipReason.KV] == 2
    assert select_prewarm(cands, 5, ROOMY, US.model_copy(update={"target_zone": "eu"})).replay == ()


def test_tracker_top_one_percent_finds_the_popular_prefixes() -> None:
    t = _tracker(min_sessions=1)
    rng = random.Random(11)
    popular = [words(120, seed=200 + i) for i in range(3)]
    for n in range(3000):
        if n % 3 == 0:
            p = popular[n % 9 // 3] + " " + words(50, seed=10_000 + n)
        else:
            p = words(120, seed=20_000 + rng.randrange(400))  # 400 others, seen ~5 times
        t.observe("east", f"s{n}", p)
    assert t.shared_prefixes("east") > 100
    sel = t.top("east", 0.01, ROOMY, Residency(min_sessions=1, source_zone="u", target_zone="u"))
    assert {p.prompt[:200] for p in sel.replay if p.prompt} >= {p[:200] for p in popular}


def test_unique_prompts_stay_out_of_the_sketch_and_the_payload_map() -> None:
    t = _tracker(max_payloads=8)
    for n in range(2000):  # every prompt new: nothing is shared, nothing is kept
        t.observe("east", f"s{n}", words(60, seed=50_000 + n))
    assert t.ranked("east") == [] and t.shared_prefixes("east") == 0
    shared = words(60, seed=1)
    for n in range(40):  # then a shared one among many unique ones
        t.observe("east", f"s{n}", shared if n % 2 else words(60, seed=60_000 + n))
    keys = {lv.key for lv in levels(PromptRequest("tiny", prompt=shared), PARAMS)}
    assert {key for key, count, _, _ in t.ranked("east") if count == 20} == keys
    assert len(t._regions["east"].entries) <= 8


def test_memoised_chain_roots_and_the_short_prompt_exit_change_no_key() -> None:
    from controlplane.kernel.prefix import identity as prefixes

    text = "x" * 64 * 40

    def chain() -> list[prefixes.Level]:
        return block_chain_text(text, 64, model="m", cache_salt="s", stride=16)

    first = chain()
    prefixes._ROOTS.clear()
    assert chain() == first and chain() == first  # computed, then from the memo
    assert [lv.blocks for lv in first] == [16, 32, 40]
    assert block_chain_text(text[: 64 * 15], 64, stride=16, tail=False) == []
    assert block_chain_text("x" * 63, 64, tail=True) == []
    assert [lv.blocks for lv in block_chain_text(text[:64], 64, stride=16)] == [1]
    assert block_chain_tokens(list(range(15)), 16) == []
    with pytest.raises(ValueError):
        block_chain_text(text, 64, stride=0)
