"""Replays carry no user credentials, only the data plane's own key (security item 2).

What a gateway keeps for warm-first replays (``PromptMemory``, a queued steered warm-up)
is stripped of ``Authorization``, ``Proxy-Authorization``, ``Cookie``, ``X-Api-Key`` and
the topology's ``prefixes.replay_strip_headers``, in any case; a replay, from a gateway
or an agent's pre-warm, sends ``Authorization: Bearer <key>`` only when the data plane
has a key of its own (vLLM's ``--api-key``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from chaos.lab.procs import until
from controlplane.kernel.config import PrefixesConfig
from controlplane.kernel.model import Routing
from controlplane.kernel.prefix.identity import PromptKind
from controlplane.kernel.prefix.prewarm import ReplayPayload
from regions.agent.engine_version import read_serving
from regions.agent.prewarm_executor import execute_prewarm, replay
from regions.agent.service import PrewarmServiceConfig
from regions.dataplane.replay_headers import (
    CREDENTIAL_HEADERS,
    read_api_key,
    replay_headers,
    replay_id,
    strip_names,
)
from regions.dataplane.replicas import ReplicaBalancer
from regions.gateway.metrics import GatewayMetrics
from regions.gateway.prompt_memory import PromptMemory
from regions.gateway.upstream import UpstreamPool
from regions.gateway.warmth import RegionWarmth, WarmUps
from tests.recording_replica import Recorder, recording_replica

USER = [
    ("Content-Type", "application/json"),
    ("AUTHORIZATION", "Bearer user-secret"),
    ("Cookie", "session=user-cookie"),
    ("proxy-Authorization", "Basic dXNlcjpwYXNz"),
    ("X-API-Key", "user-key"),
    ("X-Tenant-Token", "tenant-secret"),
    ("x-session-id", "s-1"),
]
SECRETS = ("user-secret", "user-cookie", "dXNlcjpwYXNz", "user-key", "tenant-secret")
BODY = json.dumps({"model": "tiny", "prompt": "hello " * 50, "max_tokens": 20}).encode()


def _no_secret(headers: object) -> bool:
    return not any(s in repr(headers) for s in SECRETS)


def test_credentials_are_stripped_in_any_case_and_the_rest_is_kept() -> None:
    kept = replay_headers(USER)
    assert kept == [
        ("Content-Type", "application/json"),
        ("X-Tenant-Token", "tenant-secret"),  # not a credential unless the topology says so
        ("x-session-id", "s-1"),
    ]
    assert not {k.lower() for k, _ in kept} & CREDENTIAL_HEADERS
    # The topology's names, in any case, go too; the defaults are never dropped.
    kept = replay_headers(USER, ["x-tenant-TOKEN", " "])
    assert kept == [("Content-Type", "application/json"), ("x-session-id", "s-1")]
    assert _no_secret(kept)
    assert strip_names(["X-Foo"]) == CREDENTIAL_HEADERS | {"x-foo"}


def test_a_replay_authenticates_with_the_data_planes_key_never_the_users() -> None:
    sent = replay_headers(USER, (), "dp-key")
    auth = [v for k, v in sent if k.lower() == "authorization"]
    assert auth == ["Bearer dp-key"]  # exactly one: the user's is gone
    assert "user-secret" not in repr(sent)
    assert not any(k.lower() == "authorization" for k, _ in replay_headers(USER, (), None))
    assert not any(k.lower() == "authorization" for k, _ in replay_headers(USER, (), ""))


def test_a_replay_has_a_request_id_of_its_own() -> None:
    sent = replay_headers([*USER, ("X-Request-ID", "user-1")], request_id="user-1-warm")
    assert [v for k, v in sent if k.lower() == "x-request-id"] == ["user-1-warm"]
    assert replay_id([("X-Request-Id", "user-1")], "warm") == "user-1-warm"
    assert replay_id([("X-Request-Id", "u" * 200)], "warm") == "u" * 120 + "-warm"
    fresh = replay_id(USER, "prewarm")
    assert fresh.startswith("prewarm-") and fresh != replay_id(USER, "prewarm")


def test_the_key_is_read_from_a_file(tmp_path: Path) -> None:
    f = tmp_path / "key"
    f.write_text("  dp-key \n", encoding="utf-8")
    assert read_api_key(f) == "dp-key"
    f.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(ValueError, match="no API key"):
        read_api_key(f)


def test_the_topology_lists_extra_headers_to_strip() -> None:
    assert PrefixesConfig().replay_strip_headers == ()
    p = PrefixesConfig.model_validate({"replay_strip_headers": ["X-Tenant-Token"]})
    assert p.replay_strip_headers == ("X-Tenant-Token",)


def test_the_prompt_memory_holds_no_authorization_or_cookie() -> None:
    memory = PromptMemory(strip_headers=("X-Tenant-Token",))
    memory.answered("east", 1, "/v1/completions", USER, BODY)
    [(key, kept)] = memory.ranked("east", 5)
    assert key == 1 and kept.body == BODY
    names = {k.lower() for k, _ in kept.headers}
    assert "authorization" not in names and "cookie" not in names
    assert not names & (CREDENTIAL_HEADERS | {"x-tenant-token"})
    assert ("x-session-id", "s-1") in kept.headers and _no_secret(kept.headers)
    # Its bytes count what is kept, not what was sent.
    assert memory.size("east") == len(BODY) + len("/v1/completions") + sum(
        len(k) + len(v) for k, v in kept.headers
    )


@pytest.fixture
async def recorder() -> AsyncIterator[Recorder]:
    async with recording_replica() as rec:
        yield rec


@pytest.mark.parametrize("api_key", [None, "dp-key"])
async def test_warm_ups_replay_without_the_users_credentials(
    recorder: Recorder, api_key: str | None
) -> None:
    pool = UpstreamPool()
    balancers = {"east": ReplicaBalancer([recorder.url])}
    ups = WarmUps(
        RegionWarmth(),
        pool,
        balancers,
        GatewayMetrics({"east": "us"}),
        replicas=1,
        strip_headers=("x-tenant-token",),
        api_key=api_key,
    )
    try:
        # Steered: the request's headers, as the gateway hands them over.
        assert ups.want("east", 1, "/v1/completions", [*USER, ("X-Request-Id", "r-1")], BODY)

        async def replayed() -> bool:
            return ups.pending == 0 and len(recorder.seen) == 1

        await until(replayed, within=5, what="the steered replay")
        # Recall: what the memory kept when east answered, replayed when east comes back.
        ups.memory.answered("east", 2, "/v1/completions", USER, BODY)
        ups.routing_changed({"east": Routing(targets={"west": 1.0})})  # failed over
        ups.routing_changed({"east": Routing(targets={"east": 1.0})})  # serves again

        async def recalled() -> bool:
            return len(recorder.seen) == 2

        await until(recalled, within=5, what="the recall")
    finally:
        await ups.close()
        pool.close()
    for seen in recorder.seen:
        assert _no_secret(seen), seen
        assert "cookie" not in seen and "x-tenant-token" not in seen
        assert seen.get("authorization") == (f"Bearer {api_key}" if api_key else None)
        assert seen["x-session-id"] == "s-1"
    # Each replay is a request of its own, named after the one it replays when it had
    # an id (the steered one), else a new one (the recall's memory had none).
    steered, recalled_ = (seen["x-request-id"] for seen in recorder.seen)
    assert steered == "r-1-warm"
    assert recalled_.startswith("warm-") and len(recalled_) > len("warm-") + 16


def _payload() -> ReplayPayload:
    return ReplayPayload(
        key="k",
        kind=PromptKind.TEXT,
        model="tiny",
        prompt="x" * 64,
        blocks=1,
        block_size=16,
        tokens=16,
        tokens_exact=False,
    )


async def test_the_agents_pre_warm_replays_carry_only_the_data_planes_key(
    recorder: Recorder,
) -> None:
    async with aiohttp.ClientSession() as http:
        await replay(http, recorder.url, _payload(), 5.0)
        out = await execute_prewarm(http, [_payload()], [recorder.url], budget_s=5.0, api_key="k1")
    assert out.warmed == 1
    assert "authorization" not in recorder.seen[0]  # no key configured: none sent
    assert recorder.seen[1]["authorization"] == "Bearer k1"
    # The run's replays are named after it: <run id>-<payload index>.
    assert recorder.seen[1]["x-request-id"].startswith("prewarm-")
    assert recorder.seen[1]["x-request-id"].endswith("-0")
    config = PrewarmServiceConfig(replay_api_key="k1")  # type: ignore[arg-type]
    assert "k1" not in repr(config)  # a secret: never in a log line or a dump


async def test_the_agent_reads_the_served_models_with_the_data_planes_key(
    recorder: Recorder,
) -> None:
    """vLLM's --api-key guards /v1/*: the agent's read of /v1/models (the serving
    configuration) sends the data plane's key, and only there."""
    async with aiohttp.ClientSession() as http:
        await read_serving(http, recorder.url, 5.0, "k1")
        await read_serving(http, recorder.url, 5.0)
    models = [s for s in recorder.seen if s[":path"] == "/v1/models"]
    assert [s.get("authorization") for s in models] == ["Bearer k1", None]


def test_the_agent_reads_its_replay_key_from_a_file(tmp_path: Path) -> None:
    from regions.agent.cli import parse_args

    f = tmp_path / "key"
    f.write_text("dp-key\n", encoding="utf-8")
    base = ["--region", "east", "--control-plane", "127.0.0.1:1", "--replica", "http://r:1"]
    config = parse_args([*base, "--replay-api-key-file", str(f)])
    key = config.prewarm.replay_api_key
    assert key is not None and key.get_secret_value() == "dp-key"
    assert parse_args(base).prewarm.replay_api_key is None
    with pytest.raises(SystemExit):
        parse_args([*base, "--replay-api-key-file", str(tmp_path / "missing")])


def test_the_gateway_reads_its_replay_key_from_a_file(tmp_path: Path) -> None:
    from regions.gateway.__main__ import parse_args

    f = tmp_path / "key"
    f.write_text("dp-key\n", encoding="utf-8")
    base = ["--topology", "examples/topology.yaml", "--region", "us-east"]
    options, _ = parse_args([*base, "--replay-api-key-file", str(f)])
    assert options.replay_api_key == "dp-key" and "dp-key" not in repr(options)
    assert parse_args(base)[0].replay_api_key is None
    with pytest.raises(SystemExit):
        parse_args([*base, "--replay-api-key-file", str(tmp_path / "missing")])
