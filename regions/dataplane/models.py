"""Which model pool a request goes to (docs/models.md): the data plane's side of a
topology whose regions hold one pool per served model.

A request names its model (the body's ``model``; for an endpoint picker that does not
read bodies, the header its Envoy sets). The *family* answering it is the pools that
list the model (pools of one name, one per region, serving the same models), or, for
a region without pools, that region itself (it answers whatever a request names, as
before pools existed). Each family routes on its own: its own session pins
(``sessions/<id>/<family>``: a conversation with a model is served by one region at a
time), its own home (the family's pool in this process's region, else the first of its
zone, else its first), its own routing, replicas and failover. A model no family
answers gets vLLM's own 404 error, naming it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

from controlplane.kernel.config import Topology
from regions.dataplane.prompts import BadRequest

# The header an Envoy in front of a picker that reads no bodies sets to the request's
# model (e.g. from a route or a Lua filter; docs/models.md).
MODEL_HEADER = "x-tectonic-model"

R = TypeVar("R", covariant=True)


class UnknownModel(BadRequest):
    """No pool of this cluster answers the model: vLLM's own answer, a 404."""

    def __init__(self, model: str) -> None:
        super().__init__(f"The model `{model}` does not exist.", status=404, param="model")
        self.model = model


def home_units(topology: Topology, home: str) -> dict[str, str]:
    """Each family's home for a process of region ``home``: its pool there, else the
    first of its units in ``home``'s zone, else its first (a model this region does not
    serve is still routed, to the nearest region that does)."""
    zone = topology.region(topology.units_of(home)[0]).zone
    out = {}
    for family, units in topology.families().items():
        here = [u for u in units if topology.site(u) == home]
        near = [u for u in units if topology.region(u).zone == zone]
        out[family] = (here or near or list(units))[0]
    return out


def pool_sites(topology: Topology, home: str) -> tuple[dict[str, str], dict[str, str]]:
    """For a process of region ``home``: each pool's unit -> its region, and -> the
    pool of its family in ``home`` (what serves a request another region's picker sent
    here). Both empty for a topology without pools."""
    if not topology.pooled:
        return {}, {}
    homes = home_units(topology, home)
    sites = {u: topology.site(u) for u in topology.names if topology.site(u) != u}
    local = {u: homes[topology.family(u)] for u in topology.names}
    return sites, local


class ModelRoutes(Generic[R]):
    """Per family, the object that routes it (a session resolver); ``for_model``
    finds a request's. ``default``: the family of a request that names no model (a
    ``/tokenize`` without one): the home region's first."""

    def __init__(self, topology: Topology, home: str, by_family: Mapping[str, R]) -> None:
        self.topology = topology
        self.by_family: Mapping[str, R] = dict(by_family)
        first = topology.units_of(home)[0]
        self.default = self.by_family[topology.family(first)]
        # on every request's path: one dict lookup, whatever the topology's size
        self._by_model = {
            m: self.by_family[f]
            for u in topology.names
            if (f := topology.family(u)) and (p := topology.pool_of(u)) is not None
            for m in p.models
        }
        # the regions without pools answer whatever model a request names
        self._any = self.by_family.get("")

    @property
    def pooled(self) -> bool:
        return self.topology.pooled

    def family(self, model: str) -> str:
        """The family that answers ``model``; raises UnknownModel."""
        family = self.topology.family_of_model(model)
        if family is None:
            raise UnknownModel(model)
        return family

    def for_model(self, model: str) -> R:
        """What routes a request for ``model``; raises UnknownModel."""
        got = self._by_model.get(model, self._any)
        if got is None:
            raise UnknownModel(model)
        return got

    def for_unit(self, unit: str) -> R:
        """What routes the family of ``unit`` (a region, or a pool's unit)."""
        return self.by_family[self.topology.family(unit)]

    def units_of(self, family: str) -> tuple[str, ...]:
        return self.topology.families().get(family, ())

    def models_of(self, family: str) -> tuple[str, ...] | None:
        """The model names ``family`` answers; None for the regions without pools
        (whatever their replicas serve)."""
        units = self.units_of(family)
        pool = self.topology.pool_of(units[0]) if units else None
        return pool.models if pool else None

    def __iter__(self) -> Iterator[R]:
        return iter(self.by_family.values())


class OneFamily(Generic[R]):
    """The routes of a process that knows one family (a topology without pools, or a
    caller that built its resolver itself): every model goes to it, as before pools."""

    pooled = False

    def __init__(self, only: R) -> None:
        self.default = only
        self.by_family: Mapping[str, R] = {"": only}

    def for_model(self, model: str) -> R:
        return self.default

    def for_unit(self, unit: str) -> R:
        return self.default

    def units_of(self, family: str) -> tuple[str, ...]:
        return ()  # the caller's regions, all of them

    def models_of(self, family: str) -> tuple[str, ...] | None:
        return None

    def __iter__(self) -> Iterator[R]:
        return iter((self.default,))


def families(routes: ModelRoutes[R] | OneFamily[R] | R) -> ModelRoutes[R] | OneFamily[R]:
    """``routes`` as routes by model: a lone resolver routes every model."""
    if isinstance(routes, ModelRoutes | OneFamily):
        return routes
    return OneFamily(routes)
