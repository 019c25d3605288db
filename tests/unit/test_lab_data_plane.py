"""The lab's data plane, without starting a process: with ``data_plane="envoy"`` each
region's entry in the topology is its Envoy, the traffic goes to the Envoys and the
drills scrape the pickers; the runner's observer scrapes ``data_plane_metrics_urls``,
not the traffic's entries; ``--data-plane`` reaches the lab from the demo and from
``python -m chaos.lab.run``, and the demo's summary names the data plane."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import chaos.drills.runner as runner_module
import chaos.lab.ports as lab_ports
from chaos.drills.result import DrillResult
from chaos.drills.runner import DrillRunner
from chaos.drills.scenario import find_scenario
from chaos.lab import demo, run
from chaos.lab.deployment import LocalDeployment
from chaos.lab.ports import reserved_port
from chaos.lab.spec import DeploymentSpec
from controlplane.kernel.config import load_topology

ETCD = ("127.0.0.1:2379",)


def lab(tmp_path: Path, data_plane: str) -> LocalDeployment:
    """A deployment whose topology is written (ports chosen), nothing started."""
    dep = LocalDeployment(DeploymentSpec(data_plane=data_plane), tmp_path)  # type: ignore[arg-type]
    dep.etcd = SimpleNamespace(endpoints=ETCD)  # type: ignore[assignment]
    dep.write_topology()
    return dep


def test_an_envoy_lab_enters_through_each_regions_envoy_and_scrapes_its_pickers(
    tmp_path: Path,
) -> None:
    dep = lab(tmp_path, "envoy")
    topo = load_topology(dep.topology_path)
    entries = {r.name: r.entry for r in topo.regions}
    assert entries == {r: f"127.0.0.1:{p.listen}" for r, p in dep.envoy_ports.items()}
    assert dep.gateway_urls == {r: f"http://{e}" for r, e in entries.items()}
    metrics = dep.data_plane_metrics_urls
    assert sorted(metrics) == sorted(f"{r}-epp{i}" for r in topo.names for i in (0, 1))
    assert set(metrics.values()) == {
        f"http://127.0.0.1:{p.http}" for ports in dep.picker_ports.values() for p in ports
    }
    assert sorted(dep.metrics_targets()["gateway"]) == sorted(
        u.removeprefix("http://") for u in metrics.values()
    )
    chosen = [p for e in dep.envoy_ports.values() for p in (e.listen, e.admin)]
    chosen += [p for ps in dep.picker_ports.values() for x in ps for p in (x.grpc, x.http)]
    assert len(set(chosen)) == len(chosen) == 3 * 2 + 3 * 2 * 2
    # every fixed port of the lab is below the ephemeral range: no outgoing connection
    # takes one before (or while) its process listens there
    chosen += [*dep.cp_ports.values(), *dep.cp_http_ports.values()]
    chosen += [*dep.agent_metrics_ports.values(), *(p for ps in dep.sim_ports.values() for p in ps)]
    assert len(set(chosen)) == len(chosen)
    assert all(lab_ports.RESERVED_FLOOR <= p < lab_ports._ephemeral_low() for p in chosen)


def test_a_gateway_lab_has_no_entry_and_scrapes_the_gateways(tmp_path: Path) -> None:
    dep = lab(tmp_path, "gateway")
    assert all(r.entry is None for r in load_topology(dep.topology_path).regions)
    assert not dep.envoy_ports and not dep.picker_ports
    dep.gateways = {"us-east": SimpleNamespace(url="http://127.0.0.1:9", port=9)}  # type: ignore[dict-item]
    assert dep.data_plane_metrics_urls == dep.gateway_urls == {"us-east": "http://127.0.0.1:9"}
    assert dep.metrics_targets()["gateway"] == ["127.0.0.1:9"]


def test_reserved_ports_lie_below_the_ephemeral_range_and_are_free(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lab_ports, "_ephemeral_low", lambda: 32768)
    taken: set[int] = set()
    ports = [reserved_port(taken, random.Random(1)) for _ in range(20)]
    assert len(set(ports)) == 20 and taken == set(ports)
    assert all(lab_ports.RESERVED_FLOOR <= p < 32768 for p in ports)
    with socket.socket() as s:  # one in use is never handed out
        s.bind(("127.0.0.1", 0))
        busy = s.getsockname()[1]
        monkeypatch.setattr(lab_ports, "_ephemeral_low", lambda: busy + 1)
        monkeypatch.setattr(lab_ports, "RESERVED_FLOOR", busy)
        assert reserved_port(set()) != busy  # no room left: a free port the usual way


def test_a_port_another_process_chose_is_not_chosen_again_while_it_lives() -> None:
    # Another process with the same luck (the same seed) chooses first and holds on.
    code = (
        "import random, sys; from chaos.lab.ports import reserved_port; "
        "print(reserved_port(set(), random.Random(7)), flush=True); sys.stdin.read()"
    )
    other = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert other.stdout is not None
        theirs = int(other.stdout.readline())
        assert reserved_port(set(), random.Random(7)) != theirs
    finally:
        other.communicate("", timeout=30)
    # Gone, it holds nothing: a port this process had not held is ours to choose.
    assert lab_ports._claim(theirs)


class _Stop(Exception):
    pass


async def test_the_runner_scrapes_the_data_planes_metrics_not_its_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    def observer(store: object, keys: object, topology: object, gateways: Any, *a: Any) -> None:
        seen["scraped"] = dict(gateways)
        raise _Stop

    monkeypatch.setattr(runner_module, "Observer", observer)
    monkeypatch.setattr(runner_module, "Journal", lambda *a: None)  # no file left open
    dep = lab(tmp_path, "envoy")
    drills = DrillRunner(
        target=dep, store=None, topology=load_topology(dep.topology_path), reports_root=tmp_path
    )  # type: ignore[arg-type]
    with pytest.raises(_Stop):
        await drills.run(find_scenario("region-blackout"))
    assert seen["scraped"] == dep.data_plane_metrics_urls != dep.gateway_urls


def _result() -> DrillResult:
    return DrillResult(
        id="d", scenario="region-blackout", title="t", region="us-east", started_at=0.0,
        ended_at=1.0, passed=True, report_path=str(Path("r") / "d" / "report.html"),
    )  # fmt: skip


@pytest.mark.parametrize("flag", [[], ["--data-plane", "gateway"], ["--data-plane", "envoy"]])
def test_the_demo_runs_on_the_data_plane_asked_for_and_says_which(
    flag: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    specs: list[DeploymentSpec] = []

    async def fake_run_in_lab(scenario: object, **kw: Any) -> DrillResult:
        specs.append(kw["spec"])
        return _result()

    monkeypatch.setattr(demo, "run_in_lab", fake_run_in_lab)
    assert demo.main(flag) == 0
    want = flag[1] if flag else "gateway"
    assert [s.data_plane for s in specs] == [want]
    assert f"data plane: {want} (" in capsys.readouterr().out


def test_the_lab_runner_takes_the_data_plane_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    specs: list[DeploymentSpec] = []

    async def fake_run_in_lab(scenario: object, region: object, **kw: Any) -> DrillResult:
        specs.append(kw["spec"])
        return _result()

    monkeypatch.setattr(run, "run_in_lab", fake_run_in_lab)
    assert run.main(["region-blackout", "--data-plane", "envoy"]) == 0
    assert [s.data_plane for s in specs] == ["envoy"]
    assert "data plane: envoy" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        run.main(["region-blackout", "--data-plane", "istio"])
