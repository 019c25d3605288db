"""The shipped Envoy configuration (deploy/envoy/envoy.yaml), run by a real Envoy.

Envoy accepts the shipped file and every variant the lab renders from it; rendering the
shipped values back changes nothing (the lab alters only ports, addresses and modes). With
two real simulators and no endpoint picker running: fail open serves from the round-robin
fallback, fail closed answers 500, and a client cannot choose its backend by sending the
picker's destination header itself. The picker's own path (lists, retries down the list,
the served endpoint reported back) is tested with the picker, in its tests.
"""

from __future__ import annotations

import itertools
import json
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from chaos.lab.envoy import (
    SHIPPED_CONFIG,
    EnvoyProc,
    EnvoySpec,
    load_shipped,
    render,
    start_envoy,
    stats,
    validate,
)
from chaos.lab.procs import Proc, start_simulators
from regions.picker.__main__ import parse_args as parse_picker_args
from regions.picker.service import MAX_MESSAGE_TIMEOUT_S
from regions.pool.processes import free_port
from tests.integration.sim_counts import served_count

pytestmark = pytest.mark.slow

DESTINATION = "x-gateway-destination-endpoint"
EXAMPLE_ARGS = ["--topology", "examples/topology.yaml", "--region", "us-east"]
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


# ---- helpers ---------------------------------------------------------------------------
def host_port(proc: Proc) -> str:
    return f"127.0.0.1:{proc.port}"


def post_chat(
    url: str, headers: dict[str, str] | None = None, *, stream: bool = False
) -> tuple[int, dict[str, str], bytes]:
    """POST a chat completion; (status, response headers, body), errors included."""
    body = json.dumps({**CHAT, "stream": stream}).encode()
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=body,
        headers={"content-type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def nobody_listens() -> str:
    """A picker address with nothing behind it: the picker is down."""
    return f"127.0.0.1:{free_port()}"


def lab_spec(servers: Sequence[str], *, fail_open: bool = True) -> EnvoySpec:
    # One worker thread: round robin then strictly alternates between the servers.
    return EnvoySpec(
        listen_port=free_port(),
        admin_port=free_port(),
        pickers=[nobody_listens(), nobody_listens()],
        servers=servers,
        fail_open=fail_open,
        concurrency=1,
    )


@pytest.fixture(scope="module")
def sims() -> Iterator[list[Proc]]:
    """Three simulators: the first two are the region's servers, the third is not."""
    procs = start_simulators(3)
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()


@pytest.fixture
def fallback_servers(sims: list[Proc]) -> list[str]:
    return [host_port(s) for s in sims[:2]]


@pytest.fixture
def running() -> Iterator[list[EnvoyProc]]:
    """Envoys started by a test, killed after it."""
    started: list[EnvoyProc] = []
    yield started
    for proc in started:
        proc.kill()


def start(spec: EnvoySpec, workdir: Path, running: list[EnvoyProc]) -> EnvoyProc:
    proc = start_envoy(spec, workdir)
    running.append(proc)
    return proc


# ---- (a) Envoy accepts what is shipped and what the lab renders -----------------------
def test_shipped_config_validates() -> None:
    assert "OK" in validate(SHIPPED_CONFIG)


VARIANTS = [
    {"fail_open": fail_open, "body_mode": body_mode, "direct": direct}
    for fail_open, body_mode, direct in itertools.product(
        (True, False), ("buffered", "full_duplex", "none"), (False, True)
    )
]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(f"{x}" for x in v.values()))
def test_every_rendered_variant_validates(variant: dict[str, object], tmp_path: Path) -> None:
    spec = EnvoySpec(
        listen_port=10100,
        admin_port=10101,
        pickers=["127.0.0.1:10102", "127.0.0.1:10103"],
        servers=["127.0.0.1:10104", "127.0.0.1:10105", "127.0.0.1:10106"],
        remote_entry_points=["127.0.0.1:10107"],
        **variant,  # type: ignore[arg-type]
    )
    assert "OK" in validate(render(spec), tmp_path)


def test_rendering_the_shipped_values_changes_nothing() -> None:
    """render() only sets ports, addresses and modes: given the shipped file's own
    values, it gives the shipped file back."""
    shipped = EnvoySpec(
        listen_port=10000,
        admin_port=9901,
        pickers=["127.0.0.1:9002", "127.0.0.1:9012"],
        servers=["127.0.0.1:8000", "127.0.0.1:8001"],
    )
    assert render(shipped) == load_shipped()


def test_envoy_allows_the_pickers_longest_hold() -> None:
    """The picker asks Envoy to wait for a held answer (a pool at zero waking) up to its
    --max-message-timeout, by default the shipped max_message_timeout; past that Envoy
    ignores the ask and fails the request open after message_timeout."""
    hcm = load_shipped()["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    (ext_proc,) = [
        f["typed_config"]
        for f in hcm["typed_config"]["http_filters"]
        if f["name"] == "tectonic_picker"
    ]
    seconds = float(ext_proc["max_message_timeout"].removesuffix("s"))
    assert seconds == MAX_MESSAGE_TIMEOUT_S
    assert parse_picker_args(EXAMPLE_ARGS)[0].max_message_timeout_s == seconds
    assert float(ext_proc["message_timeout"].removesuffix("s")) < seconds


# ---- (b) no picker: fail open serves, fail closed refuses -----------------------------
def test_fail_open_serves_from_the_fallback_servers(
    sims: list[Proc], fallback_servers: list[str], tmp_path: Path, running: list[EnvoyProc]
) -> None:
    envoy = start(lab_spec(fallback_servers), tmp_path, running)
    before = [served_count(s) for s in sims[:2]]

    status, headers, body = post_chat(envoy.url)
    assert status == 200, envoy.log()
    assert json.loads(body)["choices"][0]["message"]["content"]
    # The helper header that carries the served host into metadata never leaves Envoy.
    assert "x-tectonic-served-endpoint" not in {k.lower() for k in headers}

    status, _, streamed = post_chat(envoy.url, stream=True)
    assert status == 200, envoy.log()
    assert streamed.rstrip().endswith(b"data: [DONE]")

    assert sum(served_count(s) for s in sims[:2]) - sum(before) == 2
    counters = stats(envoy.admin_url)
    assert counters["http.tectonic_inference.ext_proc.failure_mode_allowed"] == 2
    assert counters["cluster.tectonic_fallback.upstream_rq_total"] == 2
    assert counters.get("cluster.tectonic_picked.upstream_rq_total", 0) == 0


def test_fail_closed_answers_500(
    sims: list[Proc], fallback_servers: list[str], tmp_path: Path, running: list[EnvoyProc]
) -> None:
    envoy = start(lab_spec(fallback_servers, fail_open=False), tmp_path, running)
    before = [served_count(s) for s in sims[:2]]

    status, _, _ = post_chat(envoy.url)

    assert status == 500, envoy.log()
    assert [served_count(s) for s in sims[:2]] == before  # nothing reached a server
    assert stats(envoy.admin_url).get("cluster.tectonic_fallback.upstream_rq_total", 0) == 0


# ---- (c) a client cannot pick its own backend -----------------------------------------
def test_client_sent_destination_header_is_stripped(
    sims: list[Proc], fallback_servers: list[str], tmp_path: Path, running: list[EnvoyProc]
) -> None:
    """No picker, fail open: a request naming a server (one outside the region's list,
    then one inside it) still goes round robin over the fallback servers."""
    envoy = start(lab_spec(fallback_servers), tmp_path, running)
    outsider, first = sims[2], sims[0]
    before = [served_count(s) for s in sims]

    for named in (outsider, outsider, first, first, first, first):
        claim = {DESTINATION: host_port(named), f"{DESTINATION}-subset": host_port(named)}
        status, _, _ = post_chat(envoy.url, claim)
        assert status == 200, envoy.log()

    gained = [served_count(s) - b for s, b in zip(sims, before, strict=True)]
    assert gained[2] == 0  # the outsider served nothing
    assert gained[0] == gained[1] == 3  # strict round robin, not "always the first"
    counters = stats(envoy.admin_url)
    assert counters["cluster.tectonic_fallback.upstream_rq_total"] == 6
    # The picked route (taken when the header is present) never saw a request.
    assert counters.get("cluster.tectonic_picked.upstream_rq_total", 0) == 0


# ---- (d) only the inference API is routed ---------------------------------------------
def test_the_model_servers_dev_endpoints_are_not_reachable_through_envoy(
    sims: list[Proc], fallback_servers: list[str], tmp_path: Path, running: list[EnvoyProc]
) -> None:
    envoy = start(lab_spec(fallback_servers), tmp_path, running)
    for path in ("/sleep", "/wake_up", "/reset_prefix_cache", "/is_sleeping"):
        request = urllib.request.Request(f"{envoy.url}{path}", data=b"", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 404, path
        assert json.loads(refused.value.read()) == {"detail": "Not Found"}
    for sim in sims[:2]:  # nobody was put to sleep
        with urllib.request.urlopen(f"{sim.url}/is_sleeping", timeout=5) as resp:
            assert json.loads(resp.read()) == {"is_sleeping": False}
    assert stats(envoy.admin_url).get("cluster.tectonic_fallback.upstream_rq_total", 0) == 0
