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

The simulated model is greedy and autoregressive over text: each output piece is a word
picked by a hash of the seed and the last characters of the text before it (prompt plus
the pieces so far). So a generation cut after k pieces and resumed from the prompt plus
those pieces' text goes on exactly as the uncut one, as a real greedy vLLM does.
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

# Deterministic "model output": each word picked by a hash of the text before it. Each
# is at most four letters, so a piece " word" is one token of this tokenizer, as a
# model's output tokens are its tokenizer's: the text generated re-tokenizes to as many
# tokens as were generated (what /tokenize tells a gateway continuing a cut stream), and
# every output id spells its piece.
_WORDS = (
    "the",
    "zone",
    "is",
    "up",
    "and",
    "load",
    "runs",
    "to",
    "a",
    "warm",
    "node",
    "when",
    "hot",
    "keys",
    "stay",
    "near",
    "so",
    "fast",
    "hits",
    "come",
    "back",
    "for",
    "each",
    "user",
)
# How much of the text before a piece decides it: enough that prompts differing only
# early on still tend to diverge, short enough to hash per token in benches.
_CONTEXT_CHARS = 200


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


def _next_piece(tail: str, seed_crc: int) -> str:
    # surrogatepass: a decoded id prompt never holds lone surrogates, but hashing must not fail.
    word = _WORDS[zlib.crc32(tail.encode("utf-8", "surrogatepass"), seed_crc) % len(_WORDS)]
    return " " + word


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

    def generate(self, context: str, count: int, *, seed: int = 0) -> list[str]:
        """The ``count`` pieces the simulated model writes after the text ``context``.

        Each piece depends only on the seed and the text before it, so
        ``generate(c, n)`` equals ``generate(c, k) + generate(c + "".join(those k), n - k)``.
        """
        seed_crc = zlib.crc32(f"{seed}:".encode())
        tail = context[-_CONTEXT_CHARS:]
        out = []
        for _ in range(count):
            piece = _next_piece(tail, seed_crc)
            if (pid := _piece_id(piece)) < _SPELLED:
                self._pieces.setdefault(pid, piece)
            out.append(piece)
            tail = (tail + piece)[-_CONTEXT_CHARS:]
        return out

    def piece_ids(self, pieces: Sequence[str]) -> list[int]:
        return [_piece_id(p) for p in pieces]


# transformers' ``apply_chat_template`` message, which vLLM answers with a 400.
BOTH_GENERATION_FLAGS = (
    "continue_final_message and add_generation_prompt are not compatible. Use "
    "continue_final_message when you want the model to continue the final message, and "
    "add_generation_prompt when you want to add a header that will prompt it to start a "
    "new assistant message instead."
)


def render_chat(
    messages: Sequence[tuple[str, str]],
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
) -> str:
    """The simulator's chat template: ``<|role|>\\ncontent\\n`` per message.

    With ``continue_final_message`` the final message is left open (no newline after its
    content, no generation prompt) so that the model continues it; like transformers'
    ``apply_chat_template``, that together with ``add_generation_prompt`` is a ValueError.
    """
    if continue_final_message and add_generation_prompt:
        raise ValueError(BOTH_GENERATION_FLAGS)
    parts = [f"<|{role}|>\n{content}\n" for role, content in messages]
    if continue_final_message and parts:
        parts[-1] = parts[-1].removesuffix("\n")
    elif add_generation_prompt:
        parts.append("<|assistant|>\n")
    return "".join(parts)
