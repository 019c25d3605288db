"""Which replica replays which prefix, and in what order (pure).

A prefix is warm only on the replica that will serve it, so each payload goes to the
replica the gateway's prefix-aware routing picks for it: the owner of the payload's
routing key on the same consistent-hash ring (``regions.dataplane.replicas``), built
from the same replica URLs. The routing key is the first ``prefix_chars`` characters
of the prompt, so a payload of at least that many characters routes like the full
prompts it was cut from (the gateway's default, 256 characters, is two CPU blocks of
text or ~16 GPU blocks: tracker levels are longer than that).

Within a replica the order stays most frequent first, so a replay cut short by the
budget has done the most valuable prefixes.
"""

from __future__ import annotations

from collections.abc import Sequence

from controlplane.kernel.prefix.identity import PromptKind
from controlplane.kernel.prefix.prewarm import ReplayPayload
from regions.dataplane.prompts import chat_prefix, completion_prefix
from regions.dataplane.ring import DEFAULT_PREFIX_CHARS, DEFAULT_VNODES, HashRing, prefix_key


def routing_text(payload: ReplayPayload, chars: int = DEFAULT_PREFIX_CHARS) -> str:
    """The text the gateway hashes to choose a replica for this payload's prompts."""
    if payload.kind is PromptKind.CHAT:
        assert payload.messages is not None
        return chat_prefix([m.model_dump() for m in payload.messages], chars)
    if payload.kind is PromptKind.TOKENS:
        assert payload.token_ids is not None
        return completion_prefix(list(payload.token_ids), chars)
    return completion_prefix(payload.prompt, chars)


def assign(
    payloads: Sequence[ReplayPayload],
    replicas: Sequence[str],
    *,
    prefix_chars: int = DEFAULT_PREFIX_CHARS,
    vnodes: int = DEFAULT_VNODES,
) -> dict[str, list[int]]:
    """Replica URL -> indexes into ``payloads`` it replays, in the payloads' order.
    Every replica appears (possibly with nothing to do); no replicas, no assignment."""
    ring = HashRing.build(replicas, vnodes)
    out: dict[str, list[int]] = {r: [] for r in ring.replicas}
    if not out:
        return out
    for i, p in enumerate(payloads):
        owner = ring.owner(prefix_key(routing_text(p, prefix_chars), prefix_chars))
        assert owner is not None  # a non-empty ring always has an owner
        out[owner].append(i)
    return out
