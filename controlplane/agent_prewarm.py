"""The pre-warmer a failover runs: top prefixes of the source replayed on each target
by the target's region agent (docs/architecture.md §4).

For each target of the plan, concurrently:

1. read the source's catalog (``prefixes/<source>``, merged by the leader from every
   gateway's sketch; ``controlplane.prefix_aggregator``);
2. ask the target agent (``RegionAgent.Describe``) for its block size, KV capacity and
   prefill rate;
3. choose (:func:`controlplane.kernel.prefix.catalog.catalog_selection`): the top 1 % of
   shared prefixes, only those seen from K sessions and only within one residency
   zone, as many as the budget and the KV capacity allow;
4. stream ``RegionAgent.Prewarm`` (wake WARM replicas, replay, verify with vLLM's
   counters) until it reports done or the budget plus a grace period runs out.

The figures returned go into the failover's record and audit entry: totals, budget
attainment, the verified hit rate, what residency and limits left out. An agent that
cannot be reached costs its prefixes (counted, not warmed) and never the failover.

**Recovery** (:meth:`AgentPrewarmer.prewarm_home`): when a failed-over region comes
back (RECOVERED, its servers restarted with cold caches), the same path replays the
region's *own* catalog on it before the first increment of traffic goes home. The
catalog survives the failover: the leader keeps a region's last catalog while no live
export mentions it, and gateways count prefixes under the region that *served* them,
so the failover's traffic is counted at the targets, not under the failed region. The
region's replicas serve nothing yet, so the share replayed is its own
(``recovery.prewarm_top_fraction``, all the budget and KV capacity allow by default)
rather than the failover's top 1 %.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Iterable, Sequence

import grpc
from tectonic_api.v1 import agent_pb2 as apb
from tectonic_api.v1 import agent_pb2_grpc as apb_grpc

from controlplane.kernel.clock import Clock
from controlplane.kernel.codec import CorruptValue, decode
from controlplane.kernel.config import Topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import FailoverPlan, PrewarmFigures
from controlplane.kernel.prefix.catalog import PrefixCatalog, catalog_selection
from controlplane.kernel.prefix.prewarm import PrewarmLimits, Residency, SkipReason
from controlplane.kernel.rpc.tls import aio_channel
from controlplane.kernel.store.port import Store

log = logging.getLogger("tectonic.prewarm")
GRACE_S = 5.0  # past the budget: the agent's own deadline plus its last report
DESCRIBE_TIMEOUT_S = 3.0
FALLBACK_PREFILL_TOKENS_PER_S = 10_000.0
_CHANNEL_OPTIONS = [("grpc.max_send_message_length", 32 << 20)]


class AgentPrewarmer:
    def __init__(
        self,
        topology: Topology,
        store: Store,
        keys: Keys,
        clock: Clock,
        *,
        min_sessions: int = 3,
        fraction: float = 0.01,
        verify: int = 8,
    ) -> None:
        self.topology, self.store, self.keys, self.clock = topology, store, keys, clock
        self.min_sessions, self.fraction, self.verify = min_sessions, fraction, verify

    async def prewarm(
        self, plan: FailoverPlan, budget_s: float, failover_id: str
    ) -> PrewarmFigures:
        return await self._run(
            plan.source, sorted(plan.targets), budget_s, failover_id, self.fraction
        )

    async def prewarm_home(
        self, region: str, budget_s: float, recovery_id: str, fraction: float
    ) -> PrewarmFigures:
        """Recovery: ``region``'s own catalog replayed on ``region`` (see the module doc);
        ``fraction`` of its shared prefixes, 1.0 meaning every catalog entry."""
        return await self._run(region, [region], budget_s, recovery_id, fraction)

    async def _run(
        self,
        source: str,
        targets: Sequence[str],
        budget_s: float,
        run_id: str,
        fraction: float,
    ) -> PrewarmFigures:
        catalog = await self._catalog(source)
        if catalog is None or not catalog.entries:
            log.warning("%s: no prefix catalog yet; nothing to pre-warm", source)
            return PrewarmFigures(prefixes_total=0.0, catalog_entries=0.0, budget_s=budget_s)
        # 1.0: a count, every entry (top_n takes an int as a count, a float as a share)
        share: float = len(catalog.entries) if fraction >= 1.0 else fraction
        results = await asyncio.gather(
            *(self._target(source, t, catalog, budget_s, run_id, share) for t in targets)
        )
        return _combine(results).model_copy(
            update={
                "budget_s": budget_s,
                "catalog_entries": float(len(catalog.entries)),
                "catalog_age_s": max(0.0, self.clock.now() - catalog.at),
            }
        )

    async def _catalog(self, region: str) -> PrefixCatalog | None:
        kv = await self.store.get(self.keys.prefixes(region))
        if kv is None:
            return None
        try:
            return decode(PrefixCatalog, kv.value, kv.key)
        except CorruptValue as e:
            log.error("%s", e)
            return None

    async def _target(
        self,
        source: str,
        target: str,
        catalog: PrefixCatalog,
        budget_s: float,
        failover_id: str,
        fraction: float,
    ) -> PrewarmFigures:
        src, dst = self.topology.region(source), self.topology.region(target)
        res: dict[str, object] = {"targets": 1.0}
        # With security: TLS with our certificate, and our own token (role operator).
        async with aio_channel(dst.agent, self.topology.security, options=_CHANNEL_OPTIONS) as ch:
            stub = apb_grpc.RegionAgentStub(ch)  # type: ignore[no-untyped-call]
            desc = await _describe(stub, target, dst.agent)
            residency = Residency(
                min_sessions=min(self.min_sessions, catalog.min_sessions),
                source_zone=src.zone,
                target_zone=dst.zone,
            )
            # Chosen even for an unreachable agent: its prefixes are counted, not warmed.
            sel = catalog_selection(catalog, _limits(desc, budget_s, catalog), residency, fraction)
            res["skipped"] = {r.value: float(sel.skipped.get(r, 0)) for r in SkipReason}
            res["prefixes_total"] = float(len(sel.replay))
            res["planned_prefill_s"] = sel.prefill_s
            if desc is None:
                res["targets_unreachable"] = 1.0
                return PrewarmFigures.model_validate(res)
            if not sel.replay:
                log.info(
                    "%s -> %s: no prefix may be pre-warmed (%s)",
                    source,
                    target,
                    {k.value: v for k, v in sel.skipped.items()} or "none shared",
                )
                return PrewarmFigures.model_validate(res)
            log.warning(
                "%s -> %s: pre-warming %d prefixes (%d tokens, ~%.1fs of prefill)",
                source,
                target,
                len(sel.replay),
                sel.prefill_tokens,
                sel.prefill_s,
            )
            req = apb.PrewarmRequest(
                failover_id=failover_id,
                source=source,
                budget_s=budget_s,
                payloads=[p.model_dump_json().encode() for p in sel.replay],
                activate=desc.replicas_active + desc.replicas_warm,
                verify=self.verify,
                routing_chars=self.topology.prefixes.routing_chars,
            )
            last = await self._stream(stub, req, target, budget_s)
        return _outcome(res, target, last)

    async def _stream(
        self,
        stub: apb_grpc.RegionAgentStub,
        req: apb.PrewarmRequest,
        target: str,
        budget_s: float,
    ) -> apb.PrewarmProgress | None:
        last: apb.PrewarmProgress | None = None
        logged = -1.0
        try:
            call = stub.Prewarm(req, timeout=budget_s + GRACE_S)
            async for msg in call:
                last = msg
                if msg.done or msg.elapsed_s - logged >= 5.0:
                    logged = msg.elapsed_s
                    log.info(
                        "%s: pre-warm %d/%d warmed, %d failed, %.1fs",
                        target,
                        msg.warmed,
                        msg.total,
                        msg.failed,
                        msg.elapsed_s,
                    )
        except grpc.aio.AioRpcError as e:
            log.error("%s: pre-warm stream ended: %s %s", target, e.code().name, e.details())
        return last


async def _describe(
    stub: apb_grpc.RegionAgentStub, target: str, agent: str
) -> apb.AgentDescription | None:
    """The target agent's block size, KV capacity and prefill rate; None (logged) when
    it cannot be reached."""
    try:
        desc: apb.AgentDescription = await stub.Describe(
            apb.DescribeRequest(), timeout=DESCRIBE_TIMEOUT_S
        )
    except grpc.aio.AioRpcError as e:
        log.error("%s: agent %s unreachable (%s); not pre-warmed", target, agent, e.code().name)
        return None
    return desc


def _limits(
    desc: apb.AgentDescription | None, budget_s: float, catalog: PrefixCatalog
) -> PrewarmLimits:
    """What bounds the choice on the target: the agent's figures where it gave them,
    else a typical prefill rate, no KV bound and the catalog's block size."""
    return PrewarmLimits(
        budget_s=budget_s,
        prefill_tokens_per_s=(
            desc.prefill_tokens_per_s
            if desc and desc.prefill_tokens_per_s > 0
            else FALLBACK_PREFILL_TOKENS_PER_S
        ),
        # unknown capacity: let the budget alone bound the choice
        kv_capacity_blocks=(
            desc.kv_capacity_blocks if desc and desc.kv_capacity_blocks else sys.maxsize
        ),
        block_size=(desc.block_size if desc and desc.block_size else catalog.params.block_size),
    )


def _outcome(
    res: dict[str, object], target: str, last: apb.PrewarmProgress | None
) -> PrewarmFigures:
    """The target's figures: ``res`` (the choice) with the agent's last report. A stream
    that ended before done counts the target as unreachable, keeping what it warmed."""
    if last is None or not last.done:
        res["targets_unreachable"] = 1.0
        if last is not None:
            res["prefixes_warmed"] = float(last.warmed)
        return PrewarmFigures.model_validate(res)
    if last.no_key or last.unreadable:
        # chosen by the leader, but not opened by the target's agent: said as skipped
        chosen = res.get("skipped")
        skipped = dict(chosen) if isinstance(chosen, dict) else {}
        skipped[SkipReason.NO_KEY.value] = float(last.no_key)
        skipped[SkipReason.UNREADABLE.value] = float(last.unreadable)
        res["skipped"] = skipped
        log.error("%s: pre-warm skipped sealed payloads: %s", target, last.detail)
    res.update(
        prefixes_warmed=float(last.warmed),
        prefixes_failed=float(last.failed),
        elapsed_s=last.elapsed_s,
        verified=float(last.verified),
        verified_hit_rate=last.verified_hit_rate,
        prompt_tokens=float(last.prompt_tokens),
        replicas_active=float(last.replicas_active),
        target_attained={target: last.attainment},
    )
    return PrewarmFigures.model_validate(res)


def _sum(values: Iterable[float | None]) -> float | None:
    """The sum of the figures reported; None when no target reported one."""
    present = [v for v in values if v is not None]
    return sum(present) if present else None


_SUMMED = (
    "targets",
    "targets_unreachable",
    "prefixes_total",
    "prefixes_warmed",
    "prefixes_failed",
    "planned_prefill_s",
    "verified",
    "prompt_tokens",
    "replicas_active",
)


def _combine(results: Sequence[PrewarmFigures]) -> PrewarmFigures:
    """Sum the per-target figures; the elapsed time is the slowest target's, the verified
    hit rate is weighted by samples and the attainment is warmed / total over all targets."""
    out: dict[str, object] = {k: _sum(getattr(r, k) for r in results) for k in _SUMMED}
    out["elapsed_s"] = max((r.elapsed_s for r in results if r.elapsed_s is not None), default=None)
    skipped: dict[str, float] = {}
    for r in results:
        for k, v in r.skipped.items():
            skipped[k] = skipped.get(k, 0.0) + v
    out["skipped"] = skipped
    out["target_attained"] = {t: f for r in results for t, f in r.target_attained.items()}
    total = _sum(r.prefixes_total for r in results) or 0.0
    if total > 0:
        out["attained_fraction"] = (_sum(r.prefixes_warmed for r in results) or 0.0) / total
    verified = _sum(r.verified for r in results) or 0.0
    if verified > 0:
        hits = sum((r.verified_hit_rate or 0.0) * (r.verified or 0.0) for r in results)
        out["verified_hit_rate"] = hits / verified
    return PrewarmFigures.model_validate(out)
