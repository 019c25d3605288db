"""Sealed replay payloads (issue 33, docs/residency.md): a gateway's export holds no
prompt in clear, the levels of a prompt still share one envelope, the leader merges and
shares them without a key, an agent of the zone opens each level to exactly the payload
it had in clear, and an agent without the key skips and counts what it cannot open."""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path

import pytest

from controlplane.kernel.codec import decode, encode
from controlplane.kernel.prefix.catalog import CatalogEntry, PrefixCatalog
from controlplane.kernel.prefix.identity import PromptKind, levels
from controlplane.kernel.prefix.prewarm import ReplayPayload, SkipReason, replay_payload
from controlplane.kernel.prefix.sealing import (
    Keyring,
    KeyringError,
    Unreadable,
    generate_key,
    open_payload,
    open_payloads,
    seal_entries,
    seal_payload,
)
from controlplane.kernel.store.memory import MemoryStore
from controlplane.prefix_aggregator import carry_payloads
from regions.dataplane.metrics import DataPlaneMetrics
from regions.dataplane.prefix_export import ExportOptions, PrefixExporter
from tests.unit.test_prefix_payload_sharing import (
    CHAT,
    DROPPED,
    IDS,
    KEYS,
    PARAMS,
    TEMPLATE,
    leader_catalog,
    read_payloads,
    shared,
    tracked,
)

EU = Keyring(keys={"eu-1": base64.b64decode(generate_key())}, active="eu-1", where="eu")
EU_NEXT = Keyring(
    keys={**EU.keys, "eu-2": base64.b64decode(generate_key())}, active="eu-2", where="eu"
)
US = Keyring(keys={"us-1": base64.b64decode(generate_key())}, active="us-1", where="us")
SECRETS = (TEMPLATE[:200], TEMPLATE[3000:3200], CHAT[1][1][:200], "tenant-7")


def sealed_export(kind: str, ring: Keyring = EU) -> bytes:
    export = tracked(kind).export_model()
    regions = tuple(
        r.model_copy(update={"entries": seal_entries(r.entries, ring, PARAMS)})
        for r in export.regions
    )
    return export.model_copy(update={"regions": regions}).model_dump_json().encode()


def assert_no_clear_prompt(blob: bytes) -> None:
    text = blob.decode()
    for secret in SECRETS:
        assert secret not in text
    # token ids: no run of the prompt's ids either
    assert json.dumps(IDS[:8], separators=(",", ":"))[1:-1] not in text


@pytest.mark.parametrize("kind", ["text", "tokens", "chat"])
def test_every_level_opens_to_the_payload_it_had_in_clear(kind: str) -> None:
    clear = read_payloads(tracked(kind).export())
    blob = sealed_export(kind)
    assert_no_clear_prompt(blob)
    sealed = read_payloads(blob)
    assert sealed.keys() == clear.keys()
    for key, p in sealed.items():
        assert p.sealed is not None and p.sealed.kid == "eu-1"
        assert p.prompt is p.token_ids is p.messages is p.cache_salt is None
        # what ranks and budgets a payload stays in clear
        assert (p.key, p.blocks, p.tokens, p.ancestors) == (
            clear[key].key,
            clear[key].blocks,
            clear[key].tokens,
            clear[key].ancestors,
        )
        assert open_payload(p, EU) == clear[key]
        assert open_payload(p, EU).request_body() == clear[key].request_body()


def test_a_prompts_levels_share_one_envelope_in_the_stored_export() -> None:
    chain = levels(shared("text"), PARAMS)
    blob = sealed_export("text")
    stored = [e["payload"] for r in json.loads(blob)["regions"] for e in r["entries"]]
    envelopes = [p for p in stored if p is not None]
    assert len(envelopes) < 3 and len(chain) == 43  # the deepest level, written once
    assert len(blob) < 3.5 * len(TEMPLATE)  # sealing costs about a third (base64)


def test_sealing_is_deterministic_so_an_unchanged_export_is_not_rewritten() -> None:
    assert sealed_export("chat") == sealed_export("chat")
    assert sealed_export("chat") != sealed_export("chat", EU_NEXT)


async def test_the_leader_merges_and_shares_sealed_payloads_without_a_key() -> None:
    clear = read_payloads(tracked("text").export())
    _, stored = await leader_catalog(sealed_export("text"), sealed_export("text"))
    assert_no_clear_prompt(stored)
    read = decode(PrefixCatalog, stored)
    assert len(stored) < 3.5 * len(TEMPLATE)  # shared in the catalog too
    opened = {e.key: open_payload(e.payload, EU) for e in read.entries if e.payload}
    assert opened == {k: p for k, p in clear.items() if k in opened}
    assert len(opened) >= 43


def test_without_the_key_a_payload_is_skipped_and_counted_never_read() -> None:
    payloads = list(read_payloads(sealed_export("text")).values())
    for ring in (None, US):
        opened, failed, why = open_payloads(payloads, ring)
        assert opened == [] and failed == {SkipReason.NO_KEY: len(payloads)}
        assert "eu-1" in why[0]
    # the key id is known but the bytes are another key's: authentication fails
    wrong = Keyring(keys={"eu-1": US.keys["us-1"]}, active="eu-1")
    opened, failed, _ = open_payloads(payloads, wrong)
    assert opened == [] and failed == {SkipReason.UNREADABLE: len(payloads)}
    # after a rotation the ring holding both keys opens old and new envelopes
    assert len(open_payloads(payloads, EU_NEXT)[0]) == len(payloads)


def test_an_envelope_moved_onto_another_entry_does_not_open() -> None:
    p = replay_payload(shared("text"), levels(shared("text"), PARAMS)[3], PARAMS)
    sealed = seal_payload(p, EU, PARAMS)
    for change in ({"model": "other"}, {"lora": None}, {"kind": PromptKind.TOKENS}):
        moved = sealed.model_copy(update=change)
        with pytest.raises(Unreadable) as e:
            open_payload(moved, EU)
        assert e.value.reason is SkipReason.UNREADABLE
    with pytest.raises(ValueError, match="sealed"):
        sealed.request_body()
    with pytest.raises(ValueError, match="no prompt in clear"):
        ReplayPayload.model_validate({**sealed.model_dump(), "prompt": "x"})


def _entry(p: ReplayPayload | None, key: str) -> CatalogEntry:
    return CatalogEntry(key=key, count=10, sessions=3, payload=p)


def test_the_leader_ages_out_a_rotated_key_and_never_keeps_clear_payloads() -> None:
    chain = levels(shared("text"), PARAMS)
    clear = [replay_payload(shared("text"), lv, PARAMS) for lv in chain[:3]]
    old = [seal_payload(p, EU, PARAMS) for p in clear]
    new = [seal_payload(p, EU_NEXT, PARAMS) for p in clear]

    def catalog(*entries: CatalogEntry) -> PrefixCatalog:
        return PrefixCatalog(
            region="east", at=0, params=PARAMS, min_sessions=3, shared_prefixes=9, entries=entries
        )

    previous = catalog(*(_entry(p, p.key) for p in old))
    # no fresh payload: the region's old envelopes are all it has, and are carried
    bare = catalog(*(_entry(None, p.key) for p in old))
    assert carry_payloads(bare, previous).entries == previous.entries
    # one fresh payload under the new key: old-key envelopes are no longer carried
    rotated = catalog(_entry(new[0], new[0].key), *(_entry(None, p.key) for p in old[1:]))
    out = carry_payloads(rotated, previous)
    assert [e.payload for e in out.entries] == [new[0], None, None]
    # sealed_only: a payload in clear, fresh or carried, is dropped
    mixed = catalog(_entry(clear[0], clear[0].key), _entry(None, clear[1].key))
    kept = carry_payloads(mixed, catalog(*(_entry(p, p.key) for p in clear)), sealed_only=True)
    assert [e.payload for e in kept.entries] == [None, None]
    assert encode(kept)  # still a valid catalog


def test_a_key_directory_is_checked_and_says_what_to_fix(tmp_path: Path) -> None:
    (tmp_path / "eu-1").write_text(generate_key() + "\n")
    (tmp_path / "active").write_text("eu-1\n")
    (tmp_path / "..data").mkdir()  # a Secret mount's own entries are ignored
    ring = Keyring.load(tmp_path)
    assert ring.active == "eu-1" and len(ring.keys["eu-1"]) == 32
    (tmp_path / "active").write_text("eu-9")
    with pytest.raises(KeyringError, match="names 'eu-9'"):
        Keyring.load(tmp_path)
    (tmp_path / "eu-2").write_text("not a key")
    with pytest.raises(KeyringError, match="openssl rand -base64 32"):
        Keyring.load(tmp_path)
    with pytest.raises(KeyringError, match="not a directory"):
        Keyring.load(tmp_path / "nowhere")
    with pytest.raises(KeyringError, match="no 'active'"):
        seal_payload(
            replay_payload(shared("text"), levels(shared("text"), PARAMS)[0], PARAMS),
            Keyring(keys=EU.keys),
            PARAMS,
        )


async def test_a_gateway_whose_keys_fail_exports_no_payload_never_one_in_clear(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    t = tracked("chat")
    clear = read_payloads(t.export())
    metrics, store = DataPlaneMetrics(), MemoryStore()
    keys = tmp_path / "keys"

    def exporter(gateway: str) -> PrefixExporter:
        options = ExportOptions(payload_keys=str(keys))
        return PrefixExporter(
            store,
            KEYS,
            t,
            options,
            gateway_id=gateway,
            payloads_dropped=metrics.prefix_payloads_dropped,
        )

    # the directory is missing: the export goes without payloads, said and counted
    broken = exporter("g1")
    with caplog.at_level(logging.ERROR, "tectonic.gateway.prefixes"):
        assert await broken.export_once()
    kv = await store.get(KEYS.prefix_export("g1"))
    assert kv is not None and read_payloads(kv.value) == {}
    assert_no_clear_prompt(kv.value)
    assert "none leaves in clear" in caplog.text and "not a directory" in caplog.text
    assert metrics.registry.get_sample_value(DROPPED) == len(clear)
    # the keys mounted (a Secret arriving late): the next round seals, no restart
    keys.mkdir()
    (keys / "eu-1").write_text(base64.b64encode(EU.keys["eu-1"]).decode())
    (keys / "active").write_text("eu-1")
    assert await broken.export_once()
    kv = await store.get(KEYS.prefix_export("g1"))
    assert kv is not None
    assert_no_clear_prompt(kv.value)
    assert {k: open_payload(p, EU) for k, p in read_payloads(kv.value).items()} == clear
    assert metrics.registry.get_sample_value(DROPPED) == len(clear)  # nothing lost now
