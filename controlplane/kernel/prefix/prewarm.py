"""Replay payloads, residency and the pre-warm choice (pure).

A prefix the tracker counts (its key from ``controlplane.kernel.prefix.identity``) carries a
:class:`ReplayPayload`: what prefills it again, byte for byte, on another region.

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

**Stored once per chain** (:func:`shared_payloads`, :func:`restore_payloads`): in an
export or a catalog, the levels of one prompt share the deepest level's payload.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any, NamedTuple, Protocol, Self, TypeVar

from pydantic import Field, model_validator

from controlplane.kernel.model import Frozen
from controlplane.kernel.prefix.identity import (
    FingerprintParams,
    Level,
    PromptKind,
    PromptRequest,
    prompt_text,
)

# ---- replay payloads ----------------------------------------------------------------


class ChatMessage(Frozen):
    role: str
    content: str


class SealedPrompt(Frozen):
    """A payload's prompt (its text, token ids or messages, and ``cache_salt``) sealed
    with its residency zone's data key (``controlplane.kernel.prefix.sealing``): only a
    process holding that zone's keys reads it. The levels of one prompt share its
    deepest level's envelope; each cuts the opened prompt to its own ``blocks``."""

    kid: str = Field(min_length=1, max_length=64)  # which of the zone's keys sealed it
    src: str  # the key of the level that was sealed (bound to the ciphertext)
    nonce: str  # base64
    ct: str  # base64: AES-GCM-SIV of the prompt's JSON, its tag appended


class ReplayPayload(Frozen):
    """Everything needed to prefill one prefix again, byte for byte, on another region:
    the same model, LoRA and ``cache_salt``, and the prompt's leading text, token ids or
    messages exactly as they were sent (cut where the prefix ends). Sealed, the prompt
    and ``cache_salt`` are in ``sealed`` only; what ranks and budgets it stays in clear."""

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
    sealed: SealedPrompt | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> ReplayPayload:
        clear = (self.prompt, self.token_ids, self.messages, self.cache_salt)
        if self.sealed is not None:
            if any(v is not None for v in clear):
                raise ValueError("a sealed payload carries no prompt in clear")
            return self
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
        if self.sealed is not None:
            raise ValueError(f"payload {self.key} is sealed: open it first (sealing.open_payload)")
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
    cut = _cut_prompt(request, ids, level.blocks, params)
    return ReplayPayload(
        key=level.key,
        kind=cut.kind,
        model=request.model,
        lora=request.lora,
        cache_salt=request.cache_salt,
        prompt=cut.prompt,
        token_ids=cut.token_ids,
        messages=cut.messages,
        blocks=level.blocks,
        block_size=params.block_size,
        tokens=level.blocks * params.block_size,
        tokens_exact=ids is not None,
        ancestors=tuple(ancestors),
    )


class PromptCut(NamedTuple):
    kind: PromptKind
    prompt: str | None
    token_ids: tuple[int, ...] | None
    messages: tuple[ChatMessage, ...] | None


def _cut_prompt(
    request: PromptRequest, ids: Sequence[int] | None, blocks: int, params: FingerprintParams
) -> PromptCut:
    """The leading part of a prompt that covers its first ``blocks`` blocks: token ids
    when known, else the characters of its text or rendered chat."""
    return cut_prompt(request, ids, blocks, params.block_size, params.chars_per_block)


def cut_prompt(
    request: PromptRequest,
    ids: Sequence[int] | None,
    blocks: int,
    block_size: int,
    chars_per_block: int,
) -> PromptCut:
    """:func:`_cut_prompt` with the two figures of ``FingerprintParams`` it uses (an
    opened sealed payload carries them, not the params)."""
    if ids is not None:
        return PromptCut(PromptKind.TOKENS, None, tuple(ids[: blocks * block_size]), None)
    chars = blocks * chars_per_block
    if request.messages is not None:
        return PromptCut(PromptKind.CHAT, None, None, _cut_messages(request.messages, chars))
    return PromptCut(PromptKind.TEXT, prompt_text(request)[:chars], None, None)


# ---- one payload per chain -------------------------------------------------------------
#
# Each level of a prompt carries its own payload, and each holds all the prompt before
# it: a 5.5 KB template counted at 43 levels took 120 KB, and gateways' exports were cut
# to size. A stored list of payloads (an export's region, a catalog) therefore writes a
# payload whole only when no deeper payload written whole rebuilds it exactly; the others
# are written as null and rebuilt on read from the first payload that names them among
# its ``ancestors``. An ancestor's position there is its level, hence how much of the
# deeper prompt it is: ``(i + 1) * stride`` blocks of characters, token ids, or chat
# messages with the last one cut, as ``replay_payload`` cut the request itself.
# No field is added, since leaders before this one read exports strictly (a new field
# would have had a newer gateway's whole export skipped): an older reader reads the same
# JSON as valid and misses only the payloads of the shallower levels; a newer reader
# takes an older writer's payloads, all written whole, as they are.


def _level_blocks(depth: int, params: FingerprintParams) -> int:
    return (depth + 1) * params.stride_blocks


def _is_source(p: ReplayPayload, params: FingerprintParams) -> bool:
    """Whether ``p``'s ancestors are its chain's levels at every stride, as the tracker
    counts them, so that an ancestor's position says its length."""
    return p.block_size == params.block_size and p.blocks == _level_blocks(len(p.ancestors), params)


def cut_payload(p: ReplayPayload, depth: int, params: FingerprintParams) -> ReplayPayload:
    """The payload of ``p.ancestors[depth]``: ``p``'s prompt cut where that level ends,
    as ``replay_payload`` cut the request (cutting a cut prompt shorter is cutting the
    original)."""
    # A copy, not validated again: a prefix of a valid payload is one, and this runs for
    # every shared level of every export and catalog read.
    return p.model_copy(update=_cut_fields(p, depth, params))


def _cut_fields(p: ReplayPayload, depth: int, params: FingerprintParams) -> dict[str, Any]:
    """The fields in which :func:`cut_payload` differs from ``p``. A sealed ``p``
    keeps its envelope: the level is cut once it is opened, by its ``blocks``."""
    blocks = _level_blocks(depth, params)
    if p.sealed is None:
        messages = None if p.messages is None else [(m.role, m.content) for m in p.messages]
        request = PromptRequest(p.model, p.prompt, None, messages)
        cut: dict[str, Any] = _cut_prompt(request, p.token_ids, blocks, params)._asdict()
    else:
        cut = {}
    return {
        **cut,
        "key": p.ancestors[depth],
        "blocks": blocks,
        "tokens": blocks * params.block_size,
        "ancestors": p.ancestors[:depth],
    }


def _rebuilds(src: ReplayPayload, depth: int, p: ReplayPayload, params: FingerprintParams) -> bool:
    """Whether ``cut_payload(src, depth, params) == p``, without building it (the
    fields pydantic's ``==`` compares; every export written asks this of every level)."""
    return p.__dict__ == {**src.__dict__, **_cut_fields(src, depth, params)}


def shared_payloads(
    payloads: Sequence[ReplayPayload | None],
    params: FingerprintParams,
    restorable: Sequence[bool] | None = None,
) -> list[bool]:
    """Which of a stored list's ``payloads`` are written as null: those that
    :func:`restore_payloads` rebuilds equal from a deeper one written whole (and, with
    ``restorable``, is allowed to rebuild at all)."""
    shared = [False] * len(payloads)
    present = [(i, p) for i, p in enumerate(payloads) if p is not None]
    # Deepest first: whether a payload is written decides what the shallower ones are
    # rebuilt from, and only deeper payloads name a level among their ancestors.
    present.sort(key=lambda ip: -ip[1].blocks)
    sources: dict[str, tuple[int, ReplayPayload, int]] = {}  # key -> first writer, depth
    for i, p in present:
        src = sources.get(p.key)
        if (
            src is not None
            and (restorable is None or restorable[i])
            and _rebuilds(src[1], src[2], p, params)
        ):
            shared[i] = True
            continue
        if _is_source(p, params):
            for depth, key in enumerate(p.ancestors):
                if key not in sources or sources[key][0] > i:
                    sources[key] = (i, p, depth)
    return shared


class PayloadEntry(Protocol):
    """An entry of a stored list: an export's or a catalog's."""

    @property
    def key(self) -> str: ...

    @property
    def payload(self) -> ReplayPayload | None: ...

    def model_copy(
        self, *, update: Mapping[str, Any] | None = None, deep: bool = False
    ) -> Self: ...


EntryT = TypeVar("EntryT", bound=PayloadEntry)


def restore_payloads(
    entries: tuple[EntryT, ...],
    params: FingerprintParams,
    restorable: Sequence[bool] | None = None,
) -> tuple[EntryT, ...]:
    """A stored list's entries as read: each without a payload that a payload names among
    its ancestors gets it rebuilt from the first that does, where ``restorable`` allows."""
    sources: dict[str, tuple[ReplayPayload, int]] = {}
    for e in entries:
        if e.payload is not None and _is_source(e.payload, params):
            for depth, key in enumerate(e.payload.ancestors):
                sources.setdefault(key, (e.payload, depth))
    if not sources:
        return entries
    return tuple(
        e.model_copy(update={"payload": cut_payload(*sources[e.key], params)})
        if e.payload is None and e.key in sources and (restorable is None or restorable[i])
        else e
        for i, e in enumerate(entries)
    )


def share_in_json(
    data: list[dict[str, Any]],
    entries: Sequence[PayloadEntry],
    params: FingerprintParams,
    restorable: Sequence[bool] | None = None,
) -> list[dict[str, Any]]:
    """``entries`` as serialized (``data``) with their shared payloads nulled."""
    payloads = [e.payload for e in entries]
    for entry, shared in zip(data, shared_payloads(payloads, params, restorable), strict=True):
        if shared:
            entry["payload"] = None
    return data


def fewest_to_drop(count: int, fits: Callable[[int], bool]) -> int | None:
    """The fewest of ``count`` items, dropped in their order, after which ``fits``
    (bisection: dropping more never makes a stored list bigger); None if even all do
    not do."""
    if not fits(count):
        return None
    lo, hi = 0, count
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


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
    # Found by the target's agent, not the choice: a sealed payload it cannot open
    NO_KEY = "no_key"  # sealed with a key the target's agent does not hold (or none)
    UNREADABLE = "unreadable"  # the key is there but the envelope does not open


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
