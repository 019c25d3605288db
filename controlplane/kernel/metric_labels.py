"""The ``model`` label of a model pool's series (docs/models.md).

With model pools a series per failover unit carries ``region="<region>.<pool>"``; its
exposition also gives it ``model="<the pool's base model>"`` (its first model name), so
that a query can select or sum by model without a join. Added when the registry is
read, not at each ``labels()`` call: one place, for every series of every process that
renders its registry here, and nothing changes for a deployment without pools (its
exposition is the registry's own). ``tectonic_pool_info`` lists every name of a pool.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

MODEL_LABEL = "model"


class PoolModelLabels:
    """A collector over ``registry`` whose samples with a ``region`` label (else a
    ``from_region``: a spill, within one pool's family) naming a pool's unit also carry
    ``model`` (``models``: unit -> model)."""

    def __init__(self, registry: CollectorRegistry, models: Mapping[str, str]) -> None:
        self.registry, self.models = registry, models

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            out = Metric(family.name, family.documentation, family.type, family.unit)
            for s in family.samples:
                unit = s.labels.get("region", s.labels.get("from_region", ""))
                model = self.models.get(unit)
                labels = s.labels
                if model is not None and MODEL_LABEL not in labels:
                    labels = {**labels, MODEL_LABEL: model}
                out.add_sample(s.name, labels, s.value, s.timestamp, s.exemplar)
            yield out


def exposition(registry: CollectorRegistry, models: Mapping[str, str]) -> bytes:
    """``registry`` in Prometheus's text format, its pools' series with their ``model``
    label; without pools, exactly the registry's own."""
    if not models:
        return generate_latest(registry)
    labelled = CollectorRegistry(auto_describe=False)
    labelled.register(PoolModelLabels(registry, models))
    return generate_latest(labelled)
