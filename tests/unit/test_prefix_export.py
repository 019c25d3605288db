"""The gateway half of the prefix pipeline: the whole prompt reaches the tracker, and
the exporter ships the tracker's export to the store on a lease, cut to size."""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
import pytest

from controlplane.kernel.config import PrefixesConfig, parse_topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.prefix.identity import PromptRequest
from controlplane.kernel.prefix.tracker import PrefixTracker, TrackerConfig, TrackerExport
from controlplane.kernel.store.memory import ManualClock, MemoryStore
from regions.dataplane.observe import TrackerObserver
from regions.dataplane.prefix_export import ExportOptions, PrefixExporter, fit_export
from regions.dataplane.requests import Endpoint, parse
from regions.gateway.__main__ import _parser, parse_args
from regions.gateway.app import AppConfig
from regions.gateway.server import GatewayOptions, GatewayServer

PREFIXES = PrefixesConfig(block_size=16, chars_per_token=4.0, level_tokens=16, min_sessions=3)
LOG = "tectonic.gateway.prefixes"


def tracker(min_sessions: int = 3) -> PrefixTracker:
    return PrefixTracker(
        TrackerConfig(params=PREFIXES.params, min_sessions=min_sessions, doorkeeper_lg_bits=10)
    )


def topic(i: int, chars: int = 200) -> str:
    return (f"topic {i}: " + "lorem ipsum dolor sit amet " * 20)[:chars]


def feed(t: PrefixTracker, topics: int = 3, region: str = "east") -> None:
    """Topic i from i + 2 sessions, twice each (the tracker counts sessions from a
    key's second sighting on)."""
    for i in range(topics):
        for s in range(i + 2):
            for _ in range(2):
                t.observe_request(region, f"s{i}-{s}", PromptRequest("tiny", prompt=topic(i)))


def body(**fields: object) -> bytes:
    return json.dumps({"model": "tiny", **fields}).encode()


# ---- the whole prompt, from the one parse -----------------------------------------------


def test_parse_hands_the_tracker_the_whole_prompt() -> None:
    long = "x" * 5000
    req = parse(Endpoint.COMPLETIONS, body(prompt=long, cache_salt="tenant-7"), 256)
    assert req.prefix == long[:256]  # replica choice still looks at the first characters
    assert req.prompt == PromptRequest("tiny", prompt=long, cache_salt="tenant-7")
    assert req.prompt.prompt is not None and len(req.prompt.prompt) == 5000

    ids = parse(Endpoint.COMPLETIONS, body(prompt=[[1, 2, 3], [4]]), 256).prompt
    assert ids.token_ids == [1, 2, 3] and ids.prompt is None  # a batch: its first prompt
    first = parse(Endpoint.COMPLETIONS, body(prompt=["a b", "c"]), 256).prompt
    assert first.prompt == "a b"

    chat = parse(
        Endpoint.CHAT,
        body(
            messages=[
                {"role": "system", "content": "be brief"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "look"},
                        {"type": "image_url", "image_url": {"url": "http://x/i.png"}},
                        {"type": "text", "text": "here"},
                    ],
                },
                {"role": "assistant", "content": None},
            ],
            cache_salt=7,  # not a string: vLLM refuses it; the tracker ignores it
        ),
        256,
    )
    p = chat.prompt
    assert p.model == "tiny" and p.lora is None and p.cache_salt is None
    assert p.messages == (("system", "be brief"), ("user", "look\nhere"), ("assistant", ""))
    assert chat.prefix == "system\nbe brief\nuser\nlook\nhere\nassistant\n\n"


def test_the_tracker_observer_counts_whole_requests() -> None:
    t = tracker(min_sessions=2)
    obs = TrackerObserver(t)
    req = parse(Endpoint.COMPLETIONS, body(prompt=topic(1)), 256).prompt
    for s in ("a", "a", "b"):
        obs.observe("east", s, req)
    top_key = t.ranked("east")[0][0]
    entry = t.entry("east", top_key)
    assert entry is not None and entry[1] == 2 and entry[0] is not None
    assert entry[0].model == "tiny" and topic(1).startswith(entry[0].prompt or "-")


# ---- the exporter ---------------------------------------------------------------------


async def test_export_is_written_on_a_lease_that_expires_without_refreshes() -> None:
    clock = ManualClock()
    store, keys = MemoryStore(clock=clock), Keys("t")
    t = tracker()
    feed(t)
    ex = PrefixExporter(store, keys, t, ExportOptions(interval_s=1.0), gateway_id="g1", clock=clock)
    assert ex.options.lease_ttl_s == 3
    assert await ex.export_once()
    kv = await store.get(keys.prefix_export("g1"))
    assert kv is not None and kv.lease != 0
    export = TrackerExport.model_validate_json(kv.value)
    assert [r.region for r in export.regions] == ["east"] and export.min_sessions == 3
    entries = export.regions[0].entries
    assert any(e.payload is not None for e in entries)  # topics seen from >= 3 sessions
    assert all(e.payload is None for e in entries if len(e.sessions) < 3)

    clock.advance(2)
    assert not await ex.export_once()  # unchanged: not rewritten, the lease refreshed
    clock.advance(2)
    again = await store.get(keys.prefix_export("g1"))
    assert again is not None and again.mod_revision == kv.mod_revision

    clock.advance(3.5)  # the gateway stopped refreshing: its export goes with the lease
    assert await store.get(keys.prefix_export("g1")) is None
    assert await ex.export_once()  # a new lease, the export written again
    assert await store.get(keys.prefix_export("g1")) is not None


async def test_an_export_changes_when_the_tracker_does() -> None:
    store, keys = MemoryStore(clock=ManualClock()), Keys("t")
    t = tracker()
    ex = PrefixExporter(store, keys, t, gateway_id="g1")
    assert not await PrefixExporter(store, keys, t).export_once()  # no id yet: not serving
    assert await ex.export_once()
    feed(t)
    assert await ex.export_once()
    assert ex.exports == 2 and ex.last_bytes > 0


def test_a_cut_drops_payloads_of_the_lowest_ranked_first_then_entries() -> None:
    t = tracker(min_sessions=1)  # every admitted prefix carries a payload
    feed(t, topics=12)
    blob = t.export()
    full = TrackerExport.model_validate_json(blob)
    n_entries = len(full.regions[0].entries)
    assert all(e.payload is not None for e in full.regions[0].entries)

    out, cut = fit_export(blob, len(blob) - 1500, t.estimate)
    assert out is not None and cut is not None and len(out) <= len(blob) - 1500
    assert cut.payloads > 0 and cut.entries == 0
    entries = TrackerExport.model_validate_json(out).regions[0].entries
    assert len(entries) == n_entries
    kept = [t.estimate("east", e.key) for e in entries if e.payload is not None]
    lost = [t.estimate("east", e.key) for e in entries if e.payload is None]
    assert kept and lost and max(lost) <= min(kept)

    nothing, all_cut = fit_export(blob, 1, t.estimate)  # the sketches alone are too big
    assert nothing is None and all_cut is not None and all_cut.entries == n_entries
    bare = full.model_copy(
        update={
            "regions": tuple(
                r.model_copy(
                    update={
                        "entries": tuple(e.model_copy(update={"payload": None}) for e in r.entries)
                    }
                )
                for r in full.regions
            )
        }
    )
    no_payloads = len(bare.model_dump_json().encode())
    out, cut = fit_export(blob, no_payloads - 300, t.estimate)
    assert out is not None and cut is not None and cut.entries > 0
    region = TrackerExport.model_validate_json(out).regions[0]
    assert all(e.payload is None for e in region.entries)
    gone = {e.key for e in full.regions[0].entries} - {e.key for e in region.entries}
    assert max(t.estimate("east", k) for k in gone) <= min(
        t.estimate("east", e.key) for e in region.entries
    )
    assert fit_export(blob, len(blob), t.estimate) == (blob, None)


async def test_an_export_too_big_even_when_cut_is_not_written_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, keys = MemoryStore(clock=ManualClock()), Keys("t")
    t = tracker()
    feed(t)
    ex = PrefixExporter(store, keys, t, ExportOptions(max_bytes=200), gateway_id="g1")
    with caplog.at_level(logging.WARNING, LOG):
        assert not await ex.export_once()
    assert await store.get(keys.prefix_export("g1")) is None
    assert "not exported" in caplog.text and "export_max_bytes" in caplog.text


async def test_store_errors_are_logged_at_most_every_so_often_and_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    store, keys = MemoryStore(clock=clock), Keys("t")
    t = tracker()
    feed(t)
    opts = ExportOptions(interval_s=1.0, error_every_s=60)
    ex = PrefixExporter(store, keys, t, opts, gateway_id="g1", clock=clock)
    store.set_available(False)
    with caplog.at_level(logging.INFO, LOG):
        for _ in range(3):
            await ex.tick()  # never raises
            clock.advance(1)
        failures = [r for r in caplog.records if "failed" in r.getMessage()]
        assert len(failures) == 1 and "StoreUnavailable" in failures[0].getMessage()
        store.set_available(True)
        await ex.tick()
    assert "works again" in caplog.text
    assert await store.get(keys.prefix_export("g1")) is not None


async def test_run_exports_every_interval_until_cancelled() -> None:
    store, keys = MemoryStore(), Keys("t")
    t = tracker()
    ex = PrefixExporter(store, keys, t, ExportOptions(interval_s=0.01), gateway_id="g1")
    task = asyncio.create_task(ex.run())
    feed(t)
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ex.exports >= 1 and await store.get(keys.prefix_export("g1")) is not None


# ---- wiring: a gateway counts what it serves and exports it ----------------------------


async def test_a_gateway_counts_requests_and_exports_them() -> None:
    topology = parse_topology(
        {
            "cluster": "t",
            "regions": [{"name": "east", "zone": "us", "agent": "127.0.0.1:9", "capacity_rps": 10}],
            "prefixes": {"export_interval_s": 0.05, "level_tokens": 16, "min_sessions": 2},
        }
    )
    store = MemoryStore()
    server = GatewayServer(
        GatewayOptions(topology=topology, app=AppConfig(home="east")), store=store
    )
    assert server.tracker is not None and server.exporter is not None
    await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            for s in ("a", "a", "b", "b"):
                async with http.post(
                    server.url + "/v1/completions",
                    json={"model": "tiny", "prompt": topic(3), "max_tokens": 1},
                    headers={"x-session-id": s},
                ) as resp:
                    assert resp.status == 503  # no replicas here; counted all the same
        keys = Keys("t")

        def both_sessions(raw: bytes) -> bool:
            # An export written between two requests is not yet the whole story: wait
            # for the one that holds both sessions of an entry.
            regions = TrackerExport.model_validate_json(raw).regions
            return any(
                e.payload is not None and len(e.sessions) == 2 for r in regions for e in r.entries
            )

        for _ in range(150):
            page = await store.get_prefix(keys.prefix_exports_prefix())
            if page.kvs and both_sessions(page.kvs[0].value):
                break
            await asyncio.sleep(0.02)
        [kv] = page.kvs
        assert kv.key.startswith(keys.prefix_exports_prefix() + "gateway:east:")
        assert both_sessions(kv.value)
    finally:
        await server.stop()


def test_gateway_prefix_settings_come_from_the_topology_and_help_explains(
    tmp_path: object,
) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "t.yaml"
    path.write_text(
        "regions: [{name: east, zone: us, agent: '127.0.0.1:9', capacity_rps: 1}]\n"
        "prefixes: {block_size: 128, level_tokens: 256, min_sessions: 5, "
        "export_interval_s: 5}\n"
    )
    key = Path(str(tmp_path)) / "key"
    key.write_text("s3cret\n")
    base = ["--topology", str(path), "--region", "east"]
    options, _ = parse_args(base)
    assert options.tracker_config().params.block_size == 128
    assert options.export_options().interval_s == 5
    options, _ = parse_args(
        [*base, "--prefix-export-interval", "7", "--prefix-session-key-file", str(key)]
    )
    cfg = options.tracker_config()
    assert cfg.min_sessions == 5 and cfg.session_key == "s3cret"
    assert options.export_options().lease_ttl_s == 21
    with pytest.raises(SystemExit):
        parse_args([*base, "--prefix-export-max-bytes", "10"])  # under the 4 KiB floor
    assert not parse_args([*base, "--no-prefix-tracking"])[0].prefix_tracking
    text = _parser().format_help()
    for flag in ("--prefix-export-interval", "--no-prefix-tracking"):
        assert flag in text


@pytest.mark.parametrize(
    "flag",
    [
        "--prefix-chars",
        "--prefix-block-size",
        "--prefix-chars-per-token",
        "--prefix-level-tokens",
        "--prefix-min-sessions",
    ],
)
def test_settings_that_must_agree_have_no_gateway_flag(
    tmp_path: object, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    # They live in the topology, which the leader publishes as the cluster spec; a
    # flag could only make this gateway disagree with the others.
    from pathlib import Path

    path = Path(str(tmp_path)) / "t.yaml"
    path.write_text("regions: [{name: east, zone: us, agent: '127.0.0.1:9', capacity_rps: 1}]\n")
    with pytest.raises(SystemExit):
        parse_args(["--topology", str(path), "--region", "east", flag, "16"])
    assert "unrecognized arguments" in capsys.readouterr().err
    assert flag + " " not in _parser().format_help()


def test_prefix_chars_come_from_the_topology(tmp_path: object) -> None:
    # Gateways route by a hash of the prompt's first routing_chars characters and the
    # agents' pre-warm replays on the replica that hash picks: one value for all, in the
    # topology (and the cluster spec; tests/integration/test_cluster_spec.py).
    from pathlib import Path

    path = Path(str(tmp_path)) / "t.yaml"
    path.write_text(
        "regions: [{name: east, zone: us, agent: '127.0.0.1:9', capacity_rps: 1}]\n"
        "prefixes: {routing_chars: 64}\n"
    )
    assert parse_args(["--topology", str(path), "--region", "east"])[0].app.prefix_chars == 64
