"""``PodStateLabeler``: the warm pool's state of each replica, as a label on its pod.

    labeler = PodStateLabeler(conn, "models", pod_of=launcher.pod_of)
    pool = WarmPool(launcher, config, on_state=labeler.replica_changed)
    task = asyncio.create_task(labeler.run())

``tectonic.io/pool-state`` is ``active``, ``warm`` or ``idle`` (the label is removed
when the replica goes COLD), so that a Service, an InferencePool or an Istio route can
select ``tectonic.io/pool-state=active`` and never send a request to a sleeping vLLM,
without knowing Tectonic. The pool's callback is synchronous and must stay short:
:meth:`replica_changed` only notes the wanted label; :meth:`run` writes it with a
strategic-merge PATCH of the pod's metadata (a label set to null is removed), the last
state of each pod winning over any not written yet, retried with backoff while the API
refuses. A pod that is gone (404) is dropped.

What a label cannot do: it follows the pool, a moment after it (the PATCH, then the
EndpointSlice controller, then the data plane's own watch). A pod just put to sleep is
still selected for that moment; the agent's own routing (pools/<region> in etcd) is the
one that is never late.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aiohttp
from kubernetes_asyncio.client import CoreV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from regions.kube.client import KubeConnection
from regions.pool.states import Replica, ReplicaState

log = logging.getLogger("tectonic.kube.labels")
POOL_STATE_LABEL = "tectonic.io/pool-state"
_VALUES = {
    ReplicaState.ACTIVE: "active",
    ReplicaState.WARM: "warm",
    ReplicaState.IDLE: "idle",
    ReplicaState.LENT: "lent",  # awake, out of rotation, for a capacity probe
    ReplicaState.COLD: None,  # no label: nothing runs there for the pool
}


def pool_state_label(state: ReplicaState) -> str | None:
    """The label's value for ``state`` (None: remove the label)."""
    return _VALUES[state]


def label_patch(value: str | None) -> dict[str, object]:
    """The strategic-merge patch that sets (or, with None, removes) the label."""
    return {"metadata": {"labels": {POOL_STATE_LABEL: value}}}


class PodStateLabeler:
    """Writes ``tectonic.io/pool-state`` on the pool's pods; see the module docstring."""

    def __init__(
        self,
        connection: KubeConnection,
        namespace: str,
        pod_of: Callable[[str], str | None],
        *,
        request_timeout_s: float = 10.0,
        retry_s: float = 0.5,
        max_retry_s: float = 15.0,
    ) -> None:
        self.connection, self.namespace, self.pod_of = connection, namespace, pod_of
        self.request_timeout_s = request_timeout_s
        self._retry = (retry_s, max_retry_s)
        self._wanted: dict[str, str | None] = {}  # pod -> label value not written yet
        self._written: dict[str, str | None] = {}  # pod -> label value last written
        self._dirty = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    # -- the pool's hook (synchronous, short) ------------------------------------------
    def replica_changed(self, before: Replica, after: Replica) -> None:
        """The pool moved a replica from ``before`` to ``after``: label its pod."""
        url = after.url or before.url  # a replica gone COLD has no URL any more
        pod = self.pod_of(url) if url else None
        if pod is None:
            return
        self.want(pod, pool_state_label(after.state))

    def want(self, pod: str, value: str | None) -> None:
        self._wanted[pod] = value
        self._idle.clear()
        self._dirty.set()

    # -- writing -----------------------------------------------------------------------
    def written(self) -> dict[str, str | None]:
        """What was last written on each pod (for the agent's log and the tests)."""
        return dict(self._written)

    async def flushed(self, timeout_s: float = 10.0) -> None:
        """Until every wanted label is written (or dropped)."""
        async with asyncio.timeout(timeout_s):
            await self._idle.wait()

    async def run(self) -> None:
        first, most = self._retry
        delay = first
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            failed = False
            for pod, value in list(self._wanted.items()):
                if not await self._write(pod, value):
                    failed = True
                    continue
                if self._wanted.get(pod, object()) == value:  # not changed meanwhile
                    del self._wanted[pod]
            if failed:
                self._dirty.set()
                await asyncio.sleep(delay)
                delay = min(delay * 2, most)
                continue
            delay = first
            if not self._wanted:
                self._idle.set()

    async def _write(self, pod: str, value: str | None) -> bool:
        """One PATCH; True when done (or the pod is gone), False to retry."""
        core = CoreV1Api(await self.connection.api())
        try:
            await core.patch_namespaced_pod(
                pod, self.namespace, label_patch(value), _request_timeout=self.request_timeout_s
            )
        except ApiException as e:
            if e.status == 404:
                self._written.pop(pod, None)
                return True  # gone: nothing to label
            log.warning(
                "cannot label pod %s/%s %s=%s: HTTP %s %s%s",
                self.namespace,
                pod,
                POOL_STATE_LABEL,
                value,
                e.status,
                e.reason,
                " (the service account needs patch on pods)" if e.status == 403 else "",
            )
            return False
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            log.warning("cannot label pod %s/%s: %r", self.namespace, pod, e)
            return False
        self._written[pod] = value
        log.info("pod %s/%s: %s=%s", self.namespace, pod, POOL_STATE_LABEL, value or "(removed)")
        return True
