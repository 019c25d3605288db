"""Replay payloads sealed per residency zone (docs/residency.md).

etcd copies every key to every member, and a reference layout has members in several
zones; a replay payload holds a user's prompt. With ``prefixes.sealed_payloads`` the
prompt of every payload (its text, token ids or messages, and ``cache_salt``) leaves a
gateway encrypted with its zone's data key and is opened only by an agent of the same
zone, at replay time. The leader never holds a key: it ranks, budgets and shares
payloads by what stays in clear (the prefix key, model, kind, blocks, tokens, ancestors).

* **Keys**: a directory (a Kubernetes Secret mounted only in that zone's clusters) of
  files named by key id, each the base64 of 32 random bytes, and a file ``active``
  naming the id that seals. Every key in it opens. It is read again on every use, so
  a Secret's update takes effect without a restart.
* **Cipher**: AES-GCM-SIV (RFC 8452; ``cryptography``'s ``AESGCMSIV``) with a nonce
  derived from what the envelope is bound to. It is deterministic: the same prompt
  seals to the same bytes, so an unchanged export is not written again and two
  gateways' copies of one prefix merge as equal. That tells a reader only that two
  envelopes hold the same prompt, which the clear prefix key already says.
* **Bound**: the key id, the sealed level's key, model, LoRA and kind are the
  associated data: an envelope moved onto another entry does not open.
* **Levels**: the levels of one prompt share the deepest level's envelope (as they
  share its payload in clear); an opened level is cut to its own ``blocks``.
* **Rotation**: a new key made ``active`` seals from the next export on; exports are
  rewritten every interval and the leader drops catalog payloads sealed with a key id
  no live export of the region uses any more, so old envelopes age out within a few
  intervals (``tectonic_prefix_catalog_payloads{kid}`` shows when). Then the old key
  can be removed. Nothing is re-encrypted: nothing but a zone's own processes could.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCMSIV

from controlplane.kernel.prefix.identity import FingerprintParams, PromptRequest
from controlplane.kernel.prefix.prewarm import (
    ChatMessage,
    EntryT,
    ReplayPayload,
    SealedPrompt,
    SkipReason,
    cut_prompt,
    restore_payloads,
    shared_payloads,
)

KEY_BYTES = 32
ACTIVE = "active"  # the file naming the key id that seals
MAX_KEY_ID = 64
_AAD_TAG = b"tectonic-replay-payload/1"


class KeyringError(ValueError):
    """A key directory that cannot be used; the message says what to fix."""


@dataclass(frozen=True)
class Keyring:
    """One zone's data keys: id -> 32 bytes, and the id that seals (None: open only)."""

    keys: dict[str, bytes] = field(default_factory=dict)
    active: str | None = None
    where: str = ""

    @classmethod
    def load(cls, directory: str | Path) -> Keyring:
        """The keys in ``directory`` (see the module doc). Raises KeyringError naming
        the file at fault; dot files (a Secret mount's ``..data`` links) are ignored."""
        d = Path(directory)
        if not d.is_dir():
            raise KeyringError(f"payload keys: {d} is not a directory")
        keys: dict[str, bytes] = {}
        active: str | None = None
        for f in sorted(d.iterdir()):
            if f.name.startswith(".") or not f.is_file():
                continue
            text = f.read_text(encoding="utf-8").strip()
            if f.name == ACTIVE:
                active = text
                continue
            if len(f.name) > MAX_KEY_ID:
                raise KeyringError(f"payload keys: {f}: a key id is at most {MAX_KEY_ID} chars")
            try:
                raw = base64.b64decode(text, validate=True)
            except binascii.Error:
                raw = b""
            if len(raw) != KEY_BYTES:
                raise KeyringError(
                    f"payload keys: {f} must hold the base64 of {KEY_BYTES} random bytes "
                    "(make one with: openssl rand -base64 32)"
                )
            keys[f.name] = raw
        if active is not None and active not in keys:
            raise KeyringError(
                f"payload keys: {d / ACTIVE} names {active!r}, which is not a key file there "
                f"(keys: {', '.join(sorted(keys)) or 'none'})"
            )
        return cls(keys=keys, active=active, where=str(d))


def generate_key() -> str:
    """A new data key as its file holds it."""
    return base64.b64encode(AESGCMSIV.generate_key(KEY_BYTES * 8)).decode()


class Unreadable(Exception):
    """A sealed payload this keyring cannot open, and why (a SkipReason)."""

    def __init__(self, reason: SkipReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def _aad(p: ReplayPayload, kid: str, src: str) -> bytes:
    parts = (kid, src, p.model, p.lora or "", p.kind.value)
    return b"\0".join((_AAD_TAG, *(s.encode("utf-8", "surrogatepass") for s in parts)))


def seal_payload(p: ReplayPayload, ring: Keyring, params: FingerprintParams) -> ReplayPayload:
    """``p`` with its prompt sealed by the ring's active key (an already sealed ``p``
    is returned as it is). Raises KeyringError when the ring has no active key."""
    if p.sealed is not None:
        return p
    if ring.active is None:
        raise KeyringError(f"payload keys in {ring.where or '?'}: no {ACTIVE!r} key to seal with")
    content: dict[str, Any] = {"blocks": p.blocks, "chars_per_block": params.chars_per_block}
    if p.prompt is not None:
        content["prompt"] = p.prompt
    if p.token_ids is not None:
        content["token_ids"] = list(p.token_ids)
    if p.messages is not None:
        content["messages"] = [[m.role, m.content] for m in p.messages]
    if p.cache_salt is not None:
        content["cache_salt"] = p.cache_salt
    plain = json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode()
    aad = _aad(p, ring.active, p.key)
    nonce = hashlib.blake2b(aad, digest_size=12).digest()
    ct = AESGCMSIV(ring.keys[ring.active]).encrypt(nonce, plain, aad)
    envelope = SealedPrompt(
        kid=ring.active,
        src=p.key,
        nonce=base64.b64encode(nonce).decode(),
        ct=base64.b64encode(ct).decode(),
    )
    return p.model_copy(
        update={
            "prompt": None,
            "token_ids": None,
            "messages": None,
            "cache_salt": None,
            "sealed": envelope,
        }
    )


def open_payload(p: ReplayPayload, ring: Keyring | None) -> ReplayPayload:
    """``p`` with its prompt opened and cut to its level (a clear ``p`` as it is).
    Raises Unreadable: NO_KEY when the ring lacks the key id, UNREADABLE when the
    envelope does not open or holds no prompt."""
    s = p.sealed
    if s is None:
        return p
    if ring is None or s.kid not in ring.keys:
        where = "no payload keys are configured" if ring is None else f"{ring.where} lacks it"
        raise Unreadable(SkipReason.NO_KEY, f"sealed with key {s.kid!r}; {where}")
    try:
        aad = _aad(p, s.kid, s.src)
        plain = AESGCMSIV(ring.keys[s.kid]).decrypt(
            base64.b64decode(s.nonce), base64.b64decode(s.ct), aad
        )
        content = json.loads(plain)
        pairs = content.get("messages")
        messages = None if pairs is None else [ChatMessage(role=r, content=c) for r, c in pairs]
        fields: dict[str, Any] = {
            "prompt": content.get("prompt"),
            "token_ids": content.get("token_ids"),
            "messages": messages,
        }
        if p.blocks != content["blocks"]:  # a shallower level sharing the envelope: cut
            request = PromptRequest(
                p.model, fields["prompt"], None, None if pairs is None else list(map(tuple, pairs))
            )
            cut = cut_prompt(
                request,
                fields["token_ids"],
                p.blocks,
                p.block_size,
                int(content["chars_per_block"]),
            )
            fields = {"prompt": cut.prompt, "token_ids": cut.token_ids, "messages": cut.messages}
        return ReplayPayload.model_validate(
            {
                **p.model_dump(exclude={"sealed"}),
                **fields,
                "cache_salt": content.get("cache_salt"),
            }
        )
    except InvalidTag:
        raise Unreadable(
            SkipReason.UNREADABLE, f"sealed with key {s.kid!r}, which does not open it"
        ) from None
    except (ValueError, KeyError, TypeError, binascii.Error) as e:
        raise Unreadable(SkipReason.UNREADABLE, f"a malformed envelope: {e}") from None


def open_payloads(
    payloads: Sequence[ReplayPayload], ring: Keyring | None
) -> tuple[list[ReplayPayload], Counter[SkipReason], list[str]]:
    """The payloads that open (clear ones as they are), how many did not and why (one
    line per distinct reason)."""
    opened: list[ReplayPayload] = []
    failed: Counter[SkipReason] = Counter()
    why: list[str] = []
    for p in payloads:
        try:
            opened.append(open_payload(p, ring))
        except Unreadable as e:
            failed[e.reason] += 1
            if str(e) not in why:
                why.append(str(e))
    return opened, failed, why


def sealed_kid(p: ReplayPayload | None) -> str | None:
    return p.sealed.kid if p is not None and p.sealed is not None else None


def seal_entries(
    entries: tuple[EntryT, ...], ring: Keyring, params: FingerprintParams
) -> tuple[EntryT, ...]:
    """An export's or catalog's entries with every payload sealed: those written whole
    in JSON sealed each once, those shared (rebuilt from a deeper level) rebuilt from
    the sealed deeper one, so that they still share its envelope."""
    payloads = [e.payload for e in entries]
    shared = shared_payloads(payloads, params)
    sealed = tuple(
        e.model_copy(
            update={
                "payload": None
                if e.payload is None or shared[i]
                else seal_payload(e.payload, ring, params)
            }
        )
        for i, e in enumerate(entries)
    )
    if not any(shared):
        return sealed
    return restore_payloads(sealed, params, shared)
