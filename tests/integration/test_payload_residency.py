"""Prompts stay sealed on every etcd member (issue 33, docs/residency.md).

A lab on a real three-member etcd (three ``etcd`` processes standing for three
regions), two residency zones (us-east and us-west in "us", us-central in "eu"), with
``prefixes.sealed_payloads`` and one data key per zone given only to that zone's
gateways and agents. The region-blackout drill runs under the drills' chat traffic:
its failover pre-warms us-west from us-east's catalog (attainment 1.0, as without
sealing). Then every member's own data is read, each member asked alone
(serializable reads of every key, and a snapshot of its database), and its data
directory on disk (database and write-ahead log): no system prompt the traffic sent
appears in any of them, in clear.

Then the "us" key is rotated under traffic: the new key seals from then on, the
leader's catalogs lose the old key's envelopes, the old key is removed, and a second
blackout (us-west's, pre-warmed on us-east) still attains 1.0 with nothing skipped
for want of a key.

What is judged is bytes on the members and the drills' verdicts, whose windows (RTO and
pre-warm: 30 s) are many times what a blackout takes; so scripts/test.sh runs this
module two at a time with other outcome-only labs (OUTCOMES_PAIRED there): add nothing
that times or judges a latency.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from chaos.drills.scenario import find_scenario
from chaos.drills.traffic import system_prompt
from chaos.lab.deployment import LocalDeployment
from chaos.lab.procs import until
from chaos.lab.run import drill_on, lab_traffic, running_lab
from chaos.lab.spec import DeploymentSpec
from controlplane.kernel.codec import decode
from controlplane.kernel.prefix.catalog import PrefixCatalog
from controlplane.kernel.prefix.sealing import Keyring, open_payload
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.settings import EtcdConfig
from tests.integration.store_full_helpers import etcdctl_binary

pytestmark = [pytest.mark.slow, pytest.mark.etcd, pytest.mark.timeout(480)]

SPEC = DeploymentSpec(etcd_members=3, zones=(("us-central", "eu"),), sealed_payloads=True)
GROUPS = range(12)  # more than the traffic's groups: every system prompt it could send


def secrets() -> list[bytes]:
    """What no member may hold in clear: each system prompt's distinctive opening, and
    the sentence every one of them shares."""
    out = {system_prompt(g)[:60].encode() for g in GROUPS}
    out.add(b"Never invent account numbers, prices or policies")
    return sorted(out)


def hits(data: bytes) -> list[bytes]:
    return [s for s in secrets() if s in data]


def member_reads(endpoint: str, workdir: Path) -> dict[str, bytes]:
    """One member's data, that member alone answering: every key and value
    (serializable: no quorum, its own copy) and a snapshot of its database."""
    etcdctl = etcdctl_binary()
    got = subprocess.run(
        [etcdctl, f"--endpoints={endpoint}", "get", "", "--prefix", "--consistency=s"],
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout
    snap = workdir / f"snap-{endpoint.rsplit(':', 1)[1]}.db"
    subprocess.run(
        [etcdctl, f"--endpoints={endpoint}", "snapshot", "save", str(snap)],
        capture_output=True,
        check=True,
        timeout=60,
    )
    return {"get": got, "snapshot": snap.read_bytes()}


def on_disk(data_dir: Path) -> bytes:
    return b"".join(f.read_bytes() for f in sorted(data_dir.rglob("*")) if f.is_file())


async def catalog(store: EtcdStore, key: str) -> PrefixCatalog | None:
    kv = await store.get(key)
    return None if kv is None else decode(PrefixCatalog, kv.value, kv.key)


async def catalog_keys(dep: LocalDeployment) -> set[str]:
    """The sealing keys the leader's ``tectonic_prefix_catalog_payloads`` counts in the
    "us" zone's catalogs."""
    keys: set[str] = set()
    async with aiohttp.ClientSession() as http:
        for port in dep.cp_http_ports.values():
            async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
                text = await r.text()
            if "\ntectonic_leader 1.0" not in text:
                continue
            for family in text_string_to_metric_families(text):
                if family.name == "tectonic_prefix_catalog_payloads":
                    keys |= {
                        s.labels["key"]
                        for s in family.samples
                        if s.labels["region"] in ("us-east", "us-west") and s.value > 0
                    }
    return keys


async def test_prompts_stay_sealed_on_every_member_and_a_key_rotates(tmp_path: Path) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="tectonic-test-residency-"))
    async with running_lab(SPEC, workdir, say=lambda m: None) as dep:
        store = EtcdStore(EtcdConfig(endpoints=dep.etcd_endpoints))
        await store.connect()
        try:
            scenario = find_scenario("region-blackout")
            first = await drill_on(
                dep, store, scenario, "us-east", reports=tmp_path, sessions=18, say=lambda m: None
            )
            assert first.passed, [c for c in first.criteria if not c.passed]
            assert first.figures["prewarm_attained_fraction"] == 1.0

            # The catalog carries sealed payloads, and they hold the traffic's prompts:
            # the search below looks for what is really there.
            us = Keyring.load(dep.payload_keys_dir("us"))
            east = await catalog(store, dep.keys.prefixes("us-east"))
            assert east is not None
            sealed = [e.payload for e in east.entries if e.payload is not None]
            assert sealed and all(p.sealed is not None for p in sealed)
            opened = b" ".join(open_payload(p, us).request_body() for p in sealed)
            assert hits(opened), "the catalog's payloads hold none of the searched prompts"

            assert dep.etcd is not None
            for member in dep.etcd.members:
                reads = member_reads(member.endpoint, tmp_path)
                for what, data in reads.items():
                    assert len(data) > 10_000 and dep.keys.prefixes("us-east").encode() in data
                    assert hits(data) == [], f"{member.name} {what}: prompts in clear"
                assert hits(on_disk(member.data_dir)) == [], f"{member.name}: prompts on disk"

            # Rotation under traffic: the new key seals from the next export on, and the
            # leader's catalogs of the zone keep no envelope of the old one.
            new = dep.rotate_payload_key("us")
            traffic = lab_traffic(dep)
            traffic.add(18, list(SPEC.regions), prefix="r")

            async def only_the_new_key() -> bool:
                kids: set[str] = set()
                for region in ("us-east", "us-west"):
                    c = await catalog(store, dep.keys.prefixes(region))
                    assert c is not None
                    kids |= {
                        e.payload.sealed.kid
                        for e in c.entries
                        if e.payload is not None and e.payload.sealed is not None
                    }
                return kids == {new}

            await traffic.start()
            try:
                await until(
                    only_the_new_key, within=30, every=0.5, what="catalogs free of the old key"
                )
            finally:
                await traffic.stop()
            # what tells an operator the old key may go: the leader's metric
            assert await catalog_keys(dep) == {new}
            dep.remove_payload_key("us", "us-1")

            second = await drill_on(
                dep,
                store,
                scenario,
                "us-west",
                reports=tmp_path,
                sessions=18,
                say=lambda m: None,
                session_prefix="b",
            )
            assert second.passed, [c for c in second.criteria if not c.passed]
            assert second.figures["prewarm_attained_fraction"] == 1.0
        finally:
            await store.close()
