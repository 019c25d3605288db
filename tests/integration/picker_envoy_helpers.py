"""Helpers for the endpoint picker behind a real Envoy (test_picker_envoy.py): the
deployment the module's tests share (``World``: etcd, simulators, pickers and an Envoy per
region) and its clients: chat requests through an Envoy, and a picker asked directly over
its gRPC ext_proc service."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from chaos.lab.envoy import EnvoyProc, EnvoySpec
from chaos.lab.epp_ask import ask_picker
from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, start_picker
from controlplane.kernel.codec import encode
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import Routing
from controlplane.kernel.sessions.store import SessionStore
from controlplane.kernel.store.etcd import EtcdStore

REGION = "x-tectonic-region"
DESTINATION = "x-gateway-destination-endpoint"


def hp(port: int) -> str:
    return f"127.0.0.1:{port}"


@dataclass
class World:
    tmp: Path
    etcd: EtcdServer
    keys: Keys
    store: EtcdStore
    sessions: SessionStore
    topology: Path
    sims: dict[str, list[Proc]]
    picker_ports: dict[str, list[int]]
    envoy_ports: dict[str, tuple[int, int]]  # region -> (listen, admin)
    pickers: dict[str, list[Proc]] = field(default_factory=dict)
    envoys: dict[str, EnvoyProc] = field(default_factory=dict)

    def url(self, region: str) -> str:
        return f"http://{hp(self.envoy_ports[region][0])}"

    def envoy_spec(self, region: str, **changes: Any) -> EnvoySpec:
        listen, admin = self.envoy_ports[region]
        other = [r for r in self.envoy_ports if r != region]
        spec = EnvoySpec(
            listen_port=listen,
            admin_port=admin,
            pickers=[hp(p) for p in self.picker_ports[region]],
            servers=[hp(s.port) for s in self.sims[region]],
            remote_entry_points=[hp(self.envoy_ports[r][0]) for r in other],
        )
        return replace(spec, **changes)

    def start_picker(self, region: str, i: int) -> Proc:
        proc = start_picker(
            self.topology,
            region,
            listen=hp(self.picker_ports[region][i]),
            extra_args=["--etcd-timeout", "0.3", "--store-timeout", "0.5"],
            name=f"epp-{region}-{i}",
        )
        self.pickers.setdefault(region, []).append(proc)
        return proc

    async def pin(self, session: str) -> str:
        got = await self.sessions.get(session)
        assert got is not None, session
        return got[0].region

    async def set_routing(self, region: str, targets: dict[str, float], epoch: int) -> None:
        await self.store.put(
            self.keys.routing(region), encode(Routing(targets=targets, epoch=epoch))
        )


# ---- clients -----------------------------------------------------------------------------


def chat(text: str, **extra: object) -> dict[str, object]:
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 4,
        **extra,
    }


def post(
    url: str, body: dict[str, object], headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


async def ask(url: str, session: str, text: str = "", **extra: object) -> tuple[int, str]:
    """One request of ``session``: its status and the region that served it."""
    status, headers, _ = await asyncio.to_thread(
        post, url, chat(text or f"{session}: hello there", **extra), {"x-session-id": session}
    )
    return status, headers.get(REGION, "")


async def picks(address: str, session: str) -> str:
    """Ask one picker directly, over its gRPC ext_proc service, where a header-only
    request of ``session`` goes: the destination it answers."""
    answer = await ask_picker(address, session, "/v1/chat/completions")
    mutation = answer.request_headers.response.header_mutation
    values: list[bytes] = [
        h.header.raw_value for h in mutation.set_headers if h.header.key == DESTINATION
    ]
    assert len(values) == 1, values
    return values[0].decode()
