"""Prompt-prefix identity, replay payloads, residency and the pre-warm choice (pure).

**Identity follows vLLM's prefix cache** (automatic prefix caching, V1): only full
blocks of ``block_size`` tokens count, and block ``i`` is known by a chain hash over
blocks ``0..i`` and the extra keys (``cache_salt``, LoRA), so two prompts share block
``i`` exactly when their first ``(i + 1) * block_size`` tokens and extra keys are
equal. The keys here have that equivalence (not vLLM's hash values): block ``i``'s key
is a SHA-256 digest of the model, LoRA, salt and everything up to the end of block
``i`` (one incremental hash; a digest per block costs one ``copy()``).

Two ways to cut a prompt into blocks:

* **tokens** (exact): from token ids, when the caller has them or has the model's
  tokenizer (:func:`block_chain_tokens`). Shared keys up to block ``k`` mean vLLM
  hits ``k * block_size`` tokens for the second prompt.
* **characters** (the hot-path proxy): a text prompt is cut into blocks of
  ``round(block_size * chars_per_token)`` characters (:func:`block_chain_text`;
  chats are first rendered as ``<|role|>\\ncontent\\n`` per message). A proxy block
  stands for ``block_size`` tokens: equal keys mean equal text, hence equal tokens up
  to (about) there; the token *count* is an estimate, off by the calibration error
  (:func:`calibrate_chars_per_token`, from one ``/tokenize`` answer), checked against
  the simulator's ``prefix_cache_hits_total`` in ``tests/unit/test_prefix_validation.py``.

**Levels**: the tracker counts a prompt at every ``stride`` blocks (``level_tokens``,
256 by default), not at every block: 8 sketch updates for a 2,048-token prompt
instead of 128, and deeper levels of a shared prefix are found at 256-token grain.

**Residency** (docs/architecture.md §4): a prefix may leave its region only when seen from at
least ``min_sessions`` distinct sessions, and never into another residency zone.
Sessions are kept as keyed 64-bit hashes in a set capped at ``min_sessions`` per
heavy hitter: bounded, exact for the threshold question, and the capped union of two
capped sets (:func:`merge_sessions`) is again right for the threshold.

**Choice** (:func:`select_prewarm`): of the ``n`` most frequent prefixes, those that
may leave, in order of frequency (= prefill saved per prefill token spent), while the
budget (prefill seconds at the target's prefill rate) and the target's KV capacity in
blocks allow. A prefix whose ancestor is already chosen costs only its extra tokens;
an ancestor of a chosen prefix is not replayed (the descendant's replay warms it).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from pydantic import Field, model_validator

from controlplane.kernel.model import Frozen

KEY_BYTES = 9  # 72-bit keys: 12 base64url characters, no padding
_TOKEN_BYTES = 8  # each token id as a little-endian int64
_VERSION = b"tectonic-prefix/1"


class PromptKind(StrEnum):
    TEXT = "text"  # /v1/completions with a text prompt
    TOKENS = "tokens"  # /v1/completions with token ids
    CHAT = "chat"  # /v1/chat/completions


@dataclass(frozen=True, slots=True)
class PromptRequest:
    """What the tracker needs of one request. Exactly one of ``prompt``, ``token_ids``
    and ``messages`` is set (a plain dataclass: it is built on the hot path)."""

    model: str
    prompt: str | None = None
    token_ids: Sequence[int] | None = None
    messages: Sequence[tuple[str, str]] | None = None  # (role, text content)
    lora: str | None = None
    cache_salt: str | None = None


class FingerprintParams(Frozen):
    """How prompts are cut into blocks; every gateway and the leader must agree."""

    block_size: int = Field(16, ge=1, le=4096)  # vLLM: 16 on GPU, 128 on the CPU build
    chars_per_token: float = Field(4.0, gt=0.5, le=64.0)  # the character proxy's ratio
    level_tokens: int = Field(256, ge=1)  # count a prompt every this many tokens
    max_prefix_tokens: int = Field(8192, ge=1)  # look no further into a prompt

    @property
    def chars_per_block(self) -> int:
        return max(1, round(self.block_size * self.chars_per_token))

    @property
    def stride_blocks(self) -> int:
        return max(1, self.level_tokens // self.block_size)

    @property
    def max_blocks(self) -> int:
        return max(1, self.max_prefix_tokens // self.block_size)


class Level(NamedTuple):
    """One prefix of a prompt: its key, how many full blocks it covers, and 64 bits of
    the same digest as an int (for local filters)."""

    key: str
    blocks: int
    hash64: int


class Fingerprint(NamedTuple):
    """The longest full-block prefix of a prompt."""

    key: str  # "" when the prompt has no full block
    blocks: int
    tokens: int  # blocks * block_size (for the character proxy: what it stands for)


def render_chat(messages: Iterable[tuple[str, str]]) -> str:
    """The text the character proxy cuts for a chat (the simulator's template, without
    the generation prompt: that comes after every prefix)."""
    return "".join(f"<|{role}|>\n{content}\n" for role, content in messages)


def _root(
    unit: str, model: str, lora: str | None, cache_salt: str | None
) -> hashlib._Hash:  # the root of a chain: everything that is not the prompt
    key = (unit, model, lora, cache_salt)
    h = _ROOTS.get(key)
    if h is None:
        h = hashlib.sha256(_VERSION)
        for part in (unit, model, lora or "", cache_salt or ""):
            data = part.encode("utf-8", "surrogatepass")
            h.update(len(data).to_bytes(4, "little"))
            h.update(data)
        if len(model) + len(lora or "") + len(cache_salt or "") <= _ROOT_KEY_CHARS:
            if len(_ROOTS) >= _ROOTS_MAX:
                _ROOTS.clear()
            _ROOTS[key] = h.copy()
        return h
    return h.copy()


# Roots by (unit, model, LoRA, salt): a handful in practice (salts are per tenant);
# bounded in count and in what one entry may hold, since all of it comes from clients.
_ROOTS: dict[tuple[str, str, str | None, str | None], hashlib._Hash] = {}
_ROOTS_MAX = 1024
_ROOT_KEY_CHARS = 512


def _level(h: hashlib._Hash, blocks: int) -> Level:
    digest = h.copy().digest()
    key = base64.urlsafe_b64encode(digest[:KEY_BYTES]).decode()
    return Level(key, blocks, int.from_bytes(digest[KEY_BYTES : KEY_BYTES + 8], "little"))


def token_bytes(token_ids: Sequence[int]) -> bytes:
    """Token ids as little-endian int64s (the unit the token chain hashes)."""
    a = array("q", token_ids)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


def _has_levels(blocks: int, stride: int, tail: bool) -> bool:
    """Whether :func:`_chain` yields a key at all (a non-positive ``stride`` is left
    for it to refuse)."""
    return blocks >= stride or (tail and blocks > 0)


def _chain(
    data: bytes | str, unit_len: int, blocks: int, stride: int, tail: bool, h: hashlib._Hash
) -> list[Level]:
    """Keys at every ``stride`` blocks (and at ``blocks`` itself when ``tail``). A key
    hashes all the data before it, so it does not depend on ``stride``."""
    ends = list(range(stride, blocks + 1, stride))
    if tail and blocks and (not ends or ends[-1] != blocks):
        ends.append(blocks)
    out: list[Level] = []
    done = 0
    for end in ends:
        chunk = data[done * unit_len : end * unit_len]
        h.update(chunk.encode("utf-8", "surrogatepass") if isinstance(chunk, str) else chunk)
        out.append(_level(h, end))
        done = end
    return out


def block_chain_tokens(
    token_ids: Sequence[int],
    block_size: int,
    *,
    model: str = "",
    lora: str | None = None,
    cache_salt: str | None = None,
    stride: int = 1,
    max_blocks: int | None = None,
    tail: bool = True,
) -> list[Level]:
    """Keys of the full token blocks of a prompt, every ``stride`` blocks, and (``tail``)
    last the longest full-block prefix; partial blocks are ignored, like vLLM."""
    blocks = len(token_ids) // block_size
    if max_blocks is not None:
        blocks = min(blocks, max_blocks)
    if not _has_levels(blocks, stride, tail):
        return []
    data = token_bytes(token_ids[: blocks * block_size])
    root = _root(f"tokens:{block_size}", model, lora, cache_salt)
    return _chain(data, block_size * _TOKEN_BYTES, blocks, stride, tail, root)


def block_chain_text(
    text: str,
    chars_per_block: int,
    *,
    chat: bool = False,
    model: str = "",
    lora: str | None = None,
    cache_salt: str | None = None,
    stride: int = 1,
    max_blocks: int | None = None,
    tail: bool = True,
) -> list[Level]:
    """The character proxy of :func:`block_chain_tokens`: blocks of ``chars_per_block``
    characters (a ``chat``'s ``text`` is its :func:`render_chat`)."""
    blocks = len(text) // chars_per_block
    if max_blocks is not None:
        blocks = min(blocks, max_blocks)
    if not _has_levels(blocks, stride, tail):
        return []  # most prompts of a chat-sized workload: no hashing at all
    kind = PromptKind.CHAT if chat else PromptKind.TEXT
    root = _root(f"{kind.value}:chars:{chars_per_block}", model, lora, cache_salt)
    return _chain(text, chars_per_block, blocks, stride, tail, root)


def prompt_text(request: PromptRequest, limit: int | None = None) -> str:
    """The text the character proxy cuts: the prompt, or the rendered chat (rendered
    only as far as ``limit`` characters need)."""
    if request.prompt is not None:
        return request.prompt
    if request.messages is None:
        raise ValueError("a token-id prompt has no text")
    parts: list[str] = []
    size = 0
    for role, content in request.messages:
        if limit is not None and size >= limit:
            break
        parts.append(f"<|{role}|>\n{content}\n")
        size += len(parts[-1])
    return "".join(parts)


def levels(
    request: PromptRequest,
    params: FingerprintParams,
    token_ids: Sequence[int] | None = None,
    *,
    stride: int | None = None,
    tail: bool = False,
) -> list[Level]:
    """The keys the tracker counts for a request, every ``stride`` blocks (default: the
    params' level), from token blocks when token ids are known (given, or
    ``token_ids`` from a tokenizer), else from the character proxy. Without ``tail``
    the last partial level is not counted (it is mostly a prompt's unique suffix)."""
    step = params.stride_blocks if stride is None else stride
    ids = request.token_ids if token_ids is None else token_ids
    model, lora, salt, most = request.model, request.lora, request.cache_salt, params.max_blocks
    if ids is not None:
        return block_chain_tokens(
            ids,
            params.block_size,
            model=model,
            lora=lora,
            cache_salt=salt,
            stride=step,
            max_blocks=most,
            tail=tail,
        )
    cpb = params.chars_per_block
    return block_chain_text(
        prompt_text(request, most * cpb),
        cpb,
        chat=request.messages is not None,
        model=model,
        lora=lora,
        cache_salt=salt,
        stride=step,
        max_blocks=most,
        tail=tail,
    )


def fingerprint(
    request: PromptRequest, params: FingerprintParams, token_ids: Sequence[int] | None = None
) -> Fingerprint:
    """The identity of the request's longest full-block prefix and its token count."""
    chain = levels(request, params, token_ids, tail=True)
    if not chain:
        return Fingerprint("", 0, 0)
    last = chain[-1]
    return Fingerprint(last.key, last.blocks, last.blocks * params.block_size)


def shared_blocks(a: Sequence[Level], b: Sequence[Level]) -> int:
    """How many full blocks two chains (same stride) have in common."""
    blocks = 0
    for x, y in zip(a, b, strict=False):
        if x.key != y.key:
            break
        blocks = x.blocks
    return blocks


def calibrate_chars_per_token(text: str, tokens: int) -> float:
    """The character proxy's ratio from one tokenized sample (``/tokenize``'s count)."""
    if tokens < 1:
        raise ValueError("a calibration sample needs at least one token")
    return len(text) / tokens


# ---- replay payloads ----------------------------------------------------------------


class ChatMessage(Frozen):
    role: str
    content: str


class ReplayPayload(Frozen):
    """Everything needed to prefill one prefix again, byte for byte, on another region:
    the same model, LoRA and ``cache_salt``, and the prompt's leading text, token ids or
    messages exactly as they were sent (cut where the prefix ends)."""

    key: str
    kind: PromptKind
    model: str
    lora: str | None = None
    cache_salt: str | None = None
    prompt: str | None = None  # TEXT: the prompt's first ``chars`` characters
    token_ids: tuple[int, ...] | None = None  # TOKENS (also text prompts tokenized here)
    messages: tuple[ChatMessage, ...] | None = None  # CHAT: leading messages, the last cut
    blocks: int = Field(ge=1)
    block_size: int = Field(ge=1)
    tokens: int = Field(ge=1)  # what the prefix covers, in the tracker's block size
    tokens_exact: bool  # False for the character proxy: ``tokens`` is then an estimate
    ancestors: tuple[str, ...] = ()  # keys of this prefix's shallower levels

    @model_validator(mode="after")
    def _one_prompt(self) -> ReplayPayload:
        given = {
            PromptKind.TEXT: self.prompt,
            PromptKind.TOKENS: self.token_ids,
            PromptKind.CHAT: self.messages,
        }
        if given[self.kind] is None or sum(v is not None for v in given.values()) != 1:
            raise ValueError(f"a {self.kind.value} payload carries exactly its own prompt")
        return self

    @property
    def endpoint(self) -> str:
        return "/v1/chat/completions" if self.kind is PromptKind.CHAT else "/v1/completions"

    def request_body(self, max_tokens: int = 1) -> bytes:
        """The JSON body that replays the prefix (vLLM selects a LoRA by model name)."""
        body: dict[str, object] = {"model": self.lora or self.model}
        if self.kind is PromptKind.CHAT:
            assert self.messages is not None
            body["messages"] = [m.model_dump() for m in self.messages]
        elif self.kind is PromptKind.TOKENS:
            assert self.token_ids is not None
            body["prompt"] = list(self.token_ids)
        else:
            body["prompt"] = self.prompt
        body["max_tokens"] = max_tokens
        if self.cache_salt is not None:
            body["cache_salt"] = self.cache_salt
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def _cut_messages(messages: Sequence[tuple[str, str]], chars: int) -> tuple[ChatMessage, ...]:
    """The leading messages whose :func:`render_chat` is ``chars`` characters long,
    the last one's content cut (its header kept whole, else the message is left out)."""
    out: list[ChatMessage] = []
    used = 0
    for role, content in messages:
        header = len(role) + 5  # "<|" role "|>\n"
        if used + header >= chars:
            break
        room = chars - used - header
        out.append(ChatMessage(role=role, content=content[:room]))
        used += header + len(content) + 1
        if used >= chars:
            break
    return tuple(out)


def replay_payload(
    request: PromptRequest,
    level: Level,
    params: FingerprintParams,
    token_ids: Sequence[int] | None = None,
    ancestors: Sequence[str] = (),
) -> ReplayPayload:
    """The payload that replays ``level`` of ``request`` (as :func:`levels` keyed it)."""
    ids = request.token_ids if token_ids is None else token_ids
    tokens = level.blocks * params.block_size
    chars = level.blocks * params.chars_per_block
    prompt: str | None = None
    token_prefix: tuple[int, ...] | None = None
    messages: tuple[ChatMessage, ...] | None = None
    if ids is not None:
        kind, token_prefix = PromptKind.TOKENS, tuple(ids[:tokens])
    elif request.messages is not None:
        kind, messages = PromptKind.CHAT, _cut_messages(request.messages, chars)
    else:
        kind, prompt = PromptKind.TEXT, prompt_text(request)[:chars]
    return ReplayPayload(
        key=level.key,
        kind=kind,
        model=request.model,
        lora=request.lora,
        cache_salt=request.cache_salt,
        prompt=prompt,
        token_ids=token_prefix,
        messages=messages,
        blocks=level.blocks,
        block_size=params.block_size,
        tokens=tokens,
        tokens_exact=ids is not None,
        ancestors=tuple(ancestors),
    )


# ---- residency -----------------------------------------------------------------------


def session_hash(session_id: str, key: bytes = b"") -> str:
    """A keyed 64-bit hash of a session id (ids themselves never leave the gateway)."""
    return hashlib.blake2b(
        session_id.encode("utf-8", "surrogatepass"), digest_size=8, key=key[:64]
    ).hexdigest()


def merge_sessions(a: Iterable[str], b: Iterable[str], cap: int) -> set[str]:
    """The union of two session sets capped at ``cap`` (K: beyond the residency
    threshold the number does not matter), capped again, smallest hashes first."""
    return set(sorted(set(a) | set(b))[:cap])


class Residency(Frozen):
    min_sessions: int = Field(3, ge=1)  # K: distinct sessions before a prefix may leave
    source_zone: str
    target_zone: str


class SkipReason(StrEnum):
    OTHER_ZONE = "other_zone"  # the target is in another residency zone
    FEW_SESSIONS = "few_sessions"  # seen from fewer than K distinct sessions
    NO_PAYLOAD = "no_payload"  # counted, but no payload reached this tracker
    COVERED = "covered"  # an ancestor of a chosen prefix: its replay warms this one
    BUDGET = "budget"  # would exceed the prefill budget
    KV = "kv"  # would exceed the target's KV capacity


def may_leave(sessions: int, residency: Residency) -> SkipReason | None:
    """Why a prefix seen from ``sessions`` distinct sessions may not leave, or None."""
    if residency.source_zone != residency.target_zone:
        return SkipReason.OTHER_ZONE
    if sessions < residency.min_sessions:
        return SkipReason.FEW_SESSIONS
    return None


# ---- the choice ------------------------------------------------------------------------


class PrewarmLimits(Frozen):
    budget_s: float = Field(30.0, gt=0)  # docs/architecture.md §4: 30 s
    prefill_tokens_per_s: float = Field(gt=0)  # the target's prefill rate
    kv_capacity_blocks: int = Field(ge=0)  # blocks the warmed prefixes may hold
    block_size: int = Field(ge=1)  # the target's block size

    @property
    def budget_tokens(self) -> int:
        return int(self.budget_s * self.prefill_tokens_per_s)


class Candidate(Frozen):
    key: str
    count: int  # estimated frequency
    sessions: int  # distinct sessions seen (capped at K)
    payload: ReplayPayload | None


class Selection(Frozen):
    replay: tuple[ReplayPayload, ...] = ()  # prefill these once each, in this order
    considered: int = 0  # the top n looked at
    prefill_tokens: int = 0  # new tokens the replays prefill (shared ancestors once)
    prefill_s: float = 0.0  # at the target's rate
    kv_blocks: int = 0
    skipped: dict[SkipReason, int] = Field(default_factory=dict)


def top_n(n_or_fraction: float, universe: int) -> int:
    """An int is a count; a float in (0, 1) a fraction of ``universe`` (rounded up)."""
    if isinstance(n_or_fraction, int):
        return max(0, n_or_fraction)
    if not 0 < n_or_fraction < 1:
        raise ValueError(f"a fraction must be in (0, 1), got {n_or_fraction}")
    return math.ceil(n_or_fraction * max(0, universe))


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def select_prewarm(
    candidates: Sequence[Candidate], n: int, limits: PrewarmLimits, residency: Residency
) -> Selection:
    """Which of the ``n`` most frequent prefixes to replay on the target (see module)."""
    top = sorted(candidates, key=lambda c: (-c.count, -(c.payload.blocks if c.payload else 0)))
    top = top[:n]
    skipped: dict[SkipReason, int] = {}
    chosen: dict[str, ReplayPayload] = {}
    covered: set[str] = set()  # ancestors of chosen prefixes
    tokens = blocks = 0
    for c in top:
        reason = may_leave(c.sessions, residency)
        if reason is None and c.payload is None:
            reason = SkipReason.NO_PAYLOAD
        if reason is None and c.key in covered:
            reason = SkipReason.COVERED
        p = c.payload
        if reason is None and p is not None:
            base = max((chosen[a].tokens for a in p.ancestors if a in chosen), default=0)
            extra_tokens = p.tokens - base
            extra_blocks = _blocks(p.tokens, limits.block_size) - _blocks(base, limits.block_size)
            if tokens + extra_tokens > limits.budget_tokens:
                reason = SkipReason.BUDGET
            elif blocks + extra_blocks > limits.kv_capacity_blocks:
                reason = SkipReason.KV
        if reason is not None or p is None:
            why = reason or SkipReason.NO_PAYLOAD
            skipped[why] = skipped.get(why, 0) + 1
            continue
        chosen[c.key] = p
        covered.update(p.ancestors)
        tokens += extra_tokens
        blocks += extra_blocks
    # most frequent first: a replay cut short by time has done the most valuable ones
    replay = [p for k, p in chosen.items() if k not in covered]
    return Selection(
        replay=tuple(replay),
        considered=len(top),
        prefill_tokens=tokens,
        prefill_s=tokens / limits.prefill_tokens_per_s,
        kv_blocks=blocks,
        skipped=skipped,
    )
