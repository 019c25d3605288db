"""A region blackout by NetworkPolicy (opt-in): the deny-all policy created, checked
from where the drill runs, and deleted. Whether it isolates anything is up to the
cluster's network plugin, which the API cannot tell (:data:`NOT_ENFORCED`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import aiohttp
from kubernetes_asyncio.client import ApiClient, NetworkingV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from chaos.kube.manifests import blackout_policy, object_name
from chaos.kube.pods import KubeDrillError, Note, RegionPods, refused
from chaos.kube.workloads import routable

NOT_ENFORCED = (
    "a NetworkPolicy isolates pods only where the cluster's network plugin enforces "
    "NetworkPolicies (Calico, Cilium, Antrea...; not flannel alone); the Kubernetes API "
    "cannot tell which plugin runs, so Tectonic cannot detect it: the drill checks "
    "whether the pods still answer from where it runs, and its own observations say "
    "whether the region went dark"
)


async def isolate(
    api: ApiClient,
    region: str,
    r: RegionPods,
    *,
    timeout_s: float,
    check_after_s: float,
    note: Note,
) -> None:
    """Create the region's deny-all policy (kept if there already), then say how many of
    the pods routable before it still answer ``check_after_s`` later."""
    urls = await routable(api, r, timeout_s)
    policy = blackout_policy(region, r.namespace, r.labels)
    try:
        await NetworkingV1Api(api).create_namespaced_network_policy(
            r.namespace, policy, _request_timeout=timeout_s
        )
    except ApiException as e:
        if e.status != 409:  # there already (a blackout not rolled back): keep it
            raise KubeDrillError(refused(f"create NetworkPolicy {policy.metadata.name}", e)) from e
    note("network_policy", f"{r.namespace}/{policy.metadata.name}")
    note("enforcement", NOT_ENFORCED)
    answering = await still_answering(urls, check_after_s)
    note(
        "blackout_check",
        f"{len(answering)} of {len(urls)} pod(s) still answer /health from the drill "
        f"after {check_after_s:g}s"
        + (": the network plugin may not enforce NetworkPolicy" if answering else ""),
    )


async def unisolate(
    api: ApiClient, region: str, r: RegionPods, *, timeout_s: float, note: Note
) -> None:
    """Delete the region's deny-all policy (none there: nothing to do)."""
    name = object_name("tectonic-blackout", region)
    try:
        await NetworkingV1Api(api).delete_namespaced_network_policy(
            name, r.namespace, _request_timeout=timeout_s
        )
    except ApiException as e:
        if e.status != 404:
            raise KubeDrillError(refused(f"delete NetworkPolicy {name}", e)) from e
        return
    note("network_policy_deleted", f"{r.namespace}/{name}")


async def still_answering(urls: Sequence[str], after_s: float) -> list[str]:
    """The URLs whose /health still answers ``after_s`` seconds from now."""
    await asyncio.sleep(after_s)
    limit = aiohttp.ClientTimeout(total=1.0)

    async def answers(http: aiohttp.ClientSession, url: str) -> bool:
        try:
            async with http.get(url + "/health") as r:
                return r.status < 500
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False

    async with aiohttp.ClientSession(timeout=limit) as http:
        results = await asyncio.gather(*(answers(http, u) for u in urls))
    return [u for u, ok in zip(urls, results, strict=True) if ok]
