"""Prompt-prefix identity: fingerprint params, levels and block chains (pure).

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

What a prefix carries to another region (its replay payload), whether it may leave
(residency) and which prefixes to replay there: ``controlplane.kernel.prefix.prewarm``.
"""

from __future__ import annotations

import base64
import hashlib
import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from pydantic import Field

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
