"""A deterministic stand-in for a real tokenizer.

Text is cut into pieces of at most four non-space characters, each carrying the
whitespace that precedes it (``" hello world"`` -> ``" hell"``, ``"o"``, ``" worl"``,
``"d"``). The same text always gives the same ids in every process and on every run,
which is all the prefix cache needs. A piece of at most six UTF-8 bytes (nearly all)
is spelled in its id, so every replica decodes it, as every vLLM replica of a model
decodes every id (``/detokenize`` behind a gateway lands on any replica); a longer
one gets a stable hash, decoded only by a process that has seen it. A BOS token is
prepended when special tokens are added, like Llama's.

The chat template is a fixed, documented rendering of the messages, so that
``/tokenize`` with ``messages`` and ``/v1/chat/completions`` agree on the count.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

BOS_ID = 1
EOS_ID = 2
_FIRST_ID = 100
_VOCAB = 32_000
_PIECE = re.compile(r"\s*\S{1,4}|\s+")

# Deterministic "model output": words cycled by a hash of the prompt.
_WORDS = (
    "the",
    "region",
    "is",
    "healthy",
    "and",
    "traffic",
    "flows",
    "to",
    "a",
    "warm",
    "replica",
    "while",
    "prefix",
    "caches",
    "stay",
    "hot",
    "so",
    "first",
    "tokens",
    "arrive",
    "quickly",
    "for",
    "every",
    "session",
)


# Ids from here up spell their piece: its UTF-8 bytes (up to 6) after a 0x01 byte,
# read as a big-endian number, plus this offset; below 2**50, so exact in every JSON
# parser (doubles hold integers up to 2**53).
_SPELLED = 1 << 20
_SPELLED_BYTES = 6


def _piece_id(piece: str) -> int:
    raw = piece.encode("utf-8")
    if len(raw) <= _SPELLED_BYTES:
        return _SPELLED + int.from_bytes(b"\x01" + raw, "big")
    return _FIRST_ID + zlib.crc32(raw) % (_VOCAB - _FIRST_ID)


def _spelled(token_id: int) -> str | None:
    """The piece an id spells; None for any other id."""
    if not _SPELLED <= token_id < _SPELLED + (1 << 8 * (_SPELLED_BYTES + 1)):
        return None
    raw = (token_id - _SPELLED).to_bytes(_SPELLED_BYTES + 1, "big").lstrip(b"\x00")
    if raw[:1] != b"\x01":
        return None
    try:
        return raw[1:].decode("utf-8")
    except UnicodeDecodeError:
        return None


@dataclass
class Tokenizer:
    """Deterministic tokenizer; remembers the pieces it saw so ids can be decoded."""

    _pieces: dict[int, str] = field(default_factory=dict)

    def pieces(self, text: str) -> list[str]:
        return _PIECE.findall(text)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        ids = [BOS_ID] if add_special_tokens else []
        for piece in self.pieces(text):
            pid = _piece_id(piece)
            if pid < _SPELLED:
                self._pieces.setdefault(pid, piece)  # only a hashed piece needs memory
            ids.append(pid)
        return ids

    def _piece(self, token_id: int) -> str:
        spelled = _spelled(token_id)
        return self._pieces.get(token_id, "") if spelled is None else spelled

    def token_str(self, token_id: int) -> str:
        if token_id == BOS_ID:
            return "<s>"
        if token_id == EOS_ID:
            return "</s>"
        return self._piece(token_id)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        out = []
        for token_id in ids:
            if token_id in (BOS_ID, EOS_ID):
                if not skip_special_tokens:
                    out.append(self.token_str(token_id))
                continue
            out.append(self._piece(token_id))
        return "".join(out)

    def generate(self, prompt_ids: Sequence[int], count: int, *, seed: int = 0) -> list[str]:
        """The ``count`` output pieces the simulated model produces for a prompt."""
        start = zlib.crc32(repr((seed, tuple(prompt_ids[-64:]))).encode()) % len(_WORDS)
        out = []
        for i in range(count):
            piece = " " + _WORDS[(start + i) % len(_WORDS)]
            if (pid := _piece_id(piece)) < _SPELLED:
                self._pieces.setdefault(pid, piece)
            out.append(piece)
        return out

    def piece_ids(self, pieces: Sequence[str]) -> list[int]:
        return [_piece_id(p) for p in pieces]


def render_chat(messages: Sequence[tuple[str, str]], *, add_generation_prompt: bool = True) -> str:
    """The simulator's chat template: ``<|role|>\\ncontent\\n`` per message."""
    parts = [f"<|{role}|>\n{content}\n" for role, content in messages]
    if add_generation_prompt:
        parts.append("<|assistant|>\n")
    return "".join(parts)
