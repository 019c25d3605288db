"""The region agent's replicas when they come from a Service's EndpointSlices.

:class:`DiscoveredReplicas` (``--discovery kubernetes`` without a pool): the routable
endpoints are the agent's replicas, minus the ones its own ``GET /is_sleeping`` finds
asleep. A sleeping vLLM answers ``/health`` and passes its readiness probe, so the
kubelet and the EndpointSlice call it Ready; the agent must not count it as serving.
A replica without the dev-mode endpoints (404: no ``VLLM_SERVER_DEV_MODE``) cannot
sleep and is awake; one that does not answer keeps what was last known (its ``/health``
probe, the agent's other probe, says whether it is up).

:class:`KubeRegion`: what the agent runs on Kubernetes, started and stopped as one: the
connection, the discovery (first list at start, then its watch), and with
``--pool-launcher kubernetes`` the :class:`~regions.kube.launcher.KubernetesLauncher`
and the :class:`~regions.kube.pod_labels.PodStateLabeler` (its writer task).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp
from pydantic import BaseModel, ValidationError

from regions.kube.autoscalers import AdvisoryLauncher
from regions.kube.client import KubeConnection
from regions.kube.discovery import EndpointSliceDiscovery
from regions.kube.launcher import KubernetesLauncher
from regions.kube.pod_labels import PodStateLabeler
from regions.kube.workload import Workload

log = logging.getLogger("tectonic.kube.replicas")


class _Sleeping(BaseModel):
    is_sleeping: bool


class DiscoveredReplicas:
    """The Service's routable endpoints that are awake; fits the agent's ReplicaSet."""

    def __init__(self, discovery: EndpointSliceDiscovery) -> None:
        self.discovery = discovery
        self._sleeping: set[str] = set()

    def active(self) -> list[str]:
        return [u for u in self.discovery.urls() if u not in self._sleeping]

    def sleeping(self) -> list[str]:
        return [u for u in self.discovery.urls() if u in self._sleeping]

    def warm_count(self) -> int:
        return 0  # asleep here means someone else's: nothing the agent wakes

    async def activate(self, count: int) -> list[str]:
        return self.active()

    async def refresh(self, session: aiohttp.ClientSession, timeout_s: float) -> None:
        """Ask every routable endpoint whether it sleeps (all at once)."""
        urls = self.discovery.urls()
        answers = await asyncio.gather(*(_is_sleeping(session, u, timeout_s) for u in urls))
        for url, sleeping in zip(urls, answers, strict=True):
            if sleeping is None:
                continue  # no answer: keep what was known
            if sleeping and url not in self._sleeping:
                log.info("replica %s is asleep: not probed or counted until it wakes", url)
                self._sleeping.add(url)
            elif not sleeping and url in self._sleeping:
                log.info("replica %s is awake again", url)
                self._sleeping.discard(url)
        self._sleeping &= set(urls)  # forget endpoints that went away


async def _is_sleeping(session: aiohttp.ClientSession, url: str, timeout_s: float) -> bool | None:
    try:
        limit = aiohttp.ClientTimeout(total=timeout_s)
        async with session.get(url + "/is_sleeping", timeout=limit) as r:
            if r.status == 404:
                return False  # no dev-mode endpoints: it cannot sleep
            if r.status != 200:
                return None
            return _Sleeping.model_validate_json(await r.read()).is_sleeping
    except (aiohttp.ClientError, OSError, TimeoutError, ValidationError):
        return None


class KubeRegion:
    """The agent's Kubernetes adapters for one region; see the module docstring."""

    def __init__(
        self,
        *,
        namespace: str,
        service: str,
        port_name: str | None = None,
        port: int | None = None,
        kubeconfig: str | None = None,
        context: str | None = None,
        workload: str | None = None,
        ready_timeout_s: float = 900.0,
        stop_timeout_s: float = 120.0,
        pod_labels: bool = True,
        advisory: bool = False,  # the pool file's: never scale the workload
        connection: KubeConnection | None = None,
    ) -> None:
        self.connection = connection or KubeConnection(kubeconfig, context=context)
        self.discovery = EndpointSliceDiscovery(
            self.connection, namespace, service, port_name=port_name, port=port
        )
        self.replicas = DiscoveredReplicas(self.discovery)
        self.launcher: KubernetesLauncher | None = None
        self.labeler: PodStateLabeler | None = None
        if workload is not None:
            self.launcher = (AdvisoryLauncher if advisory else KubernetesLauncher)(
                self.discovery,
                Workload.parse(workload, namespace),
                ready_timeout_s=ready_timeout_s,
                stop_timeout_s=stop_timeout_s,
            )
            if pod_labels:
                self.labeler = PodStateLabeler(self.connection, namespace, self.launcher.pod_of)
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """The first list (raises, saying why, when the API refuses), then the watch and
        the labeler in the background: a pool launching waits on the watch."""
        await self.discovery.start()
        self._tasks.append(self.discovery.run_in_background())
        if self.labeler is not None:
            self._tasks.append(asyncio.create_task(self.labeler.run(), name="pod-labels"))

    def detach(self) -> None:
        """The agent is stopping: leave the pool's pods running (see the launcher)."""
        if self.launcher is not None:
            self.launcher.detach()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await self.connection.close()
