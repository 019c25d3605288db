"""The drill service against a cluster: ``python -m chaos --target kubernetes
--target-config drills-target.yaml --topology topology.yaml``.

The target file says where each region's model pods are (their workload, Service and
labels), which pods are the control plane's and etcd's, and where the data plane's
traffic goes in and its metrics are (optional: without them a drill measures from
etcd, the audit log and the model servers' own metrics, and sends no synthetic
traffic). Each drill gets its own ``KubernetesDrillTarget`` and runs through
``KubernetesDrillRunner`` on the deployment's etcd; the verdict and the report are the
drill runner's, as in the lab.

    namespace: tectonic                 # default for every entry below
    kubeconfig: null                    # null: the pod's service account
    blackout: delete-pods               # or scale-to-zero, network-policy (opt-in)
    regions:
      us-east: {workload: deployment/vllm-us-east, service: vllm-us-east,
                labels: {app: vllm, tectonic.io/region: us-east}}
    controlplane: {labels: {app.kubernetes.io/component: controlplane}}
    etcd: {labels: {app.kubernetes.io/name: etcd}}
    gateways: {us-east: http://tectonic-gateway-us-east:8080}   # traffic in (optional)
    sessions: 30                        # synthetic chat sessions through the gateways
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import Field, ValidationError

from chaos.drills.result import DrillResult
from chaos.drills.scenario import find_scenario
from chaos.drills.service import RunDrill
from chaos.drills.traffic import Traffic
from chaos.kube.pods import PodGroup, RegionPods
from chaos.kube.target import KubernetesDrillRunner, KubernetesDrillTarget
from controlplane.kernel.config import ConfigError, describe_errors, load_topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import Frozen

log = logging.getLogger("chaos.kube.service")


class RegionPodsConfig(Frozen):
    workload: Annotated[str, Field(description="deployment/NAME or statefulset/NAME")]
    service: str
    labels: Annotated[dict[str, str], Field(min_length=1)]
    namespace: str | None = None
    port_name: str | None = "http"


class PodGroupConfig(Frozen):
    labels: Annotated[dict[str, str], Field(min_length=1)]
    namespace: str | None = None


class TargetConfig(Frozen):
    namespace: str = "default"
    kubeconfig: str | None = None
    context: str | None = None
    blackout: Literal["delete-pods", "scale-to-zero", "network-policy"] = "delete-pods"
    ready_timeout_s: Annotated[float, Field(gt=0)] = 600.0
    regions: Annotated[dict[str, RegionPodsConfig], Field(min_length=1)]
    controlplane: PodGroupConfig | None = None
    etcd: PodGroupConfig | None = None
    gateways: dict[str, str] = Field(default_factory=dict)
    data_plane_metrics: dict[str, str] | None = None
    sessions: Annotated[int, Field(ge=0)] = 30
    reports: str = "drill-reports"

    def target(self, keys: Keys) -> KubernetesDrillTarget:
        ns = self.namespace
        regions = {
            name: RegionPods(r.namespace or ns, r.workload, r.service, r.labels, r.port_name)
            for name, r in self.regions.items()
        }
        return KubernetesDrillTarget(
            keys,
            regions,
            gateways=self.gateways,
            data_plane_metrics=self.data_plane_metrics,
            controlplane=_group(self.controlplane, ns),
            etcd=_group(self.etcd, ns),
            kubeconfig=self.kubeconfig,
            context=self.context,
            blackout=self.blackout,
            ready_timeout_s=self.ready_timeout_s,
        )


def _group(group: PodGroupConfig | None, namespace: str) -> PodGroup | None:
    return PodGroup(group.namespace or namespace, group.labels) if group else None


def load_target_config(path: Path) -> TargetConfig:
    """The target file, validated; ConfigError naming each bad field."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read the drill target file: {e}") from e
    try:
        return TargetConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{path} is invalid:\n{describe_errors(e)}") from e


def kube_run_drill(topology_path: Path | None, config_path: Path | None) -> RunDrill:
    """The drill service's ``RunDrill`` over a cluster (checked at once: a bad file is
    refused before the service starts)."""
    if topology_path is None or config_path is None:
        raise ConfigError("--target kubernetes needs --topology and --target-config")
    topology = load_topology(topology_path)
    config = load_target_config(config_path)
    unknown = sorted(set(config.regions) - set(topology.names))
    if unknown:
        raise ConfigError(
            f"{config_path}: regions {unknown} are not in the topology "
            f"(regions: {', '.join(topology.names)})"
        )
    keys = Keys(topology.cluster)

    async def run_drill(name: str, region: str | None, *, dry_run: bool = False) -> DrillResult:
        from controlplane.kernel.store.etcd import EtcdStore  # the adapter, for the process

        traffic = _traffic(config.gateways, config.sessions, list(config.regions))
        async with EtcdStore(topology.etcd) as store:
            runner = KubernetesDrillRunner(
                target=config.target(keys),
                store=store,
                topology=topology,
                reports_root=Path(config.reports),
                traffic=traffic,
                say=log.info,
            )
            if traffic is not None:
                await traffic.start()
            try:
                return await runner.run(find_scenario(name), region, dry_run=dry_run)
            finally:
                if traffic is not None:
                    await traffic.stop()

    return run_drill


def _traffic(gateways: Mapping[str, str], sessions: int, regions: list[str]) -> Traffic | None:
    homes = [r for r in regions if r in gateways]
    if not sessions or not homes:
        return None
    traffic = Traffic(gateways, stream_share=0.5)
    traffic.add(sessions, homes)
    return traffic
