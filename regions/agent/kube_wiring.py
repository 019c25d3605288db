"""The region agent's Kubernetes wiring: ``--discovery kubernetes``'s settings (the
Service whose EndpointSlices list the replicas), the adapters built from them
(:class:`regions.kube.replicas.KubeRegion`, whose client loads only when used) and what
a pool of kind ``kubernetes`` takes from those adapters (:class:`KubernetesPods`), and
the check before such a pool starts that no HPA or KEDA ScaledObject scales its workload
too (:func:`check_autoscalers`; the pool file's ``advisory: true`` hands scaling to them)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pydantic import Field, model_validator

from controlplane.kernel.model import Frozen
from regions.agent.pool_config import AgentPoolConfig, KubernetesLauncherConfig
from regions.agent.warm_pool import KubernetesPods

if TYPE_CHECKING:  # the Kubernetes client loads only for an agent that uses it
    from regions.kube.replicas import KubeRegion

log = logging.getLogger("tectonic.agent.kube")
K8S_NAME = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"  # a namespace or Service name


class AutoscalerConflict(RuntimeError):
    """A kubernetes pool would fight an HPA or a ScaledObject over its workload's
    replicas, or cannot tell whether one does: the pool does not start."""


class KubeDiscoveryConfig(Frozen):
    """``--discovery kubernetes``: the Service whose EndpointSlices list the replicas."""

    namespace: str = Field(pattern=K8S_NAME)
    service: str = Field(pattern=K8S_NAME)
    port_name: str | None = None  # None with no port: the slices' only port
    port: int | None = Field(None, ge=1, le=65535)
    kubeconfig: str | None = None  # None: in-cluster, else $KUBECONFIG / ~/.kube/config
    context: str | None = None

    @model_validator(mode="after")
    def _one_port(self) -> KubeDiscoveryConfig:
        if self.port_name is not None and self.port is not None:
            raise ValueError("give --kube-port-name or --kube-port, not both")
        return self


def kube_region(kube: KubeDiscoveryConfig, pool: AgentPoolConfig | None) -> KubeRegion:
    """The Kubernetes adapters of ``--discovery kubernetes`` (and of a kubernetes pool)."""
    from regions.kube.replicas import KubeRegion  # loads the client: only when used

    launcher = pool.launcher if pool is not None else None
    kube_pool = launcher if isinstance(launcher, KubernetesLauncherConfig) else None
    return KubeRegion(
        namespace=kube.namespace,
        service=kube.service,
        port_name=kube.port_name,
        port=kube.port,
        kubeconfig=kube.kubeconfig,
        context=kube.context,
        workload=kube_pool.workload if kube_pool else None,
        ready_timeout_s=kube_pool.ready_timeout_s if kube_pool else 900.0,
        stop_timeout_s=kube_pool.stop_timeout_s if kube_pool else 120.0,
        pod_labels=kube_pool.pod_labels if kube_pool else False,
        advisory=kube_pool.advisory if kube_pool else False,
    )


def kubernetes_pods(kube: KubeRegion | None) -> KubernetesPods | None:
    """What a pool of kind kubernetes takes from the agent's adapters: their launcher and
    pod labeler. None without discovery, or without a workload to scale (then the pool
    file's launcher is built, and a kubernetes one says it needs ``--discovery``)."""
    if kube is None or kube.launcher is None:
        return None
    labels = kube.labeler.replica_changed if kube.labeler is not None else None
    return KubernetesPods(kube.launcher, labels)


async def check_autoscalers(kube: KubeRegion, pool: AgentPoolConfig | None) -> None:
    """Before a kubernetes pool starts: an HPA or a KEDA ScaledObject targeting its
    workload would fight it over ``replicas``. Without ``advisory`` the pool refuses to
    start (:class:`AutoscalerConflict` naming each one, or the permission to grant when
    they cannot be listed); with it the pool scales nothing (its launcher is
    :class:`~regions.kube.autoscalers.AdvisoryLauncher`) and this says who does."""
    config = pool.launcher if pool is not None else None
    if kube.launcher is None or not isinstance(config, KubernetesLauncherConfig):
        return
    from regions.kube.autoscalers import AutoscalersUnknown, autoscalers_of

    workload = kube.launcher.workload
    try:
        found = await autoscalers_of(await kube.connection.api(), workload)
    except AutoscalersUnknown as e:
        if not config.advisory:
            raise AutoscalerConflict(
                f"the kubernetes pool of {workload} does not start: it cannot tell whether "
                f"an HPA or a KEDA ScaledObject scales the workload too: {e}"
            ) from e
        # advisory: the pool scales nothing, so nothing can fight it; say what is unknown
        log.warning("advisory pool of %s: cannot tell which autoscaler acts: %s", workload, e)
        return
    if found and not config.advisory:
        one = len(found) == 1
        raise AutoscalerConflict(
            f"the kubernetes pool of {workload} does not start: {', '.join(found)} "
            f"{'targets' if one else 'target'} it too and would fight the pool over its "
            f"replicas; remove {'it' if one else 'them'}, or set advisory: true in the "
            "pool file's launcher (Tectonic then scales nothing and publishes its desired "
            "replicas for the autoscaler to act on)"
        )
    if config.advisory and found:
        log.info(
            "advisory pool of %s: Tectonic will not scale the workload; %s acts on the "
            "desired replicas it publishes",
            workload,
            ", ".join(found),
        )
    elif config.advisory:
        log.warning(
            "advisory pool of %s: Tectonic will not scale the workload, and no HPA or "
            "ScaledObject targets it: nothing acts on the desired replicas it publishes",
            workload,
        )
