"""What the control plane knows of chaos drills (docs/architecture.md §6): values under
``drills/`` in etcd, written by the drill service (chaos/drills/service.py) and the API,
read by both and by ``failoverctl drill``. The drills themselves live in ``chaos/``."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from controlplane.kernel.model import Frozen

SCENARIO_NAME = r"^[a-z0-9][a-z0-9-]{0,62}$"


class DrillLock(Frozen):
    """Value of ``drills/lock``: who runs which drill on which region, since when, on
    the holder's lease (chaos/drills/lock.py takes it). The leader reads it too: a
    transition of that region while it is held is the drill's (``Cause.DRILL``)."""

    holder: str
    scenario: str
    region: str
    trigger: str
    started_at: float
    lease: int


class DrillSummary(Frozen):
    """A finished drill in a few fields: the value of ``drills/history/<id>`` and a row
    of every history table (the full result stays in its report directory)."""

    id: str
    scenario: str
    region: str
    started_at: float
    ended_at: float
    passed: bool
    dry_run: bool = False
    aborted: str = ""
    failed: tuple[str, ...] = ()  # names of the failed criteria
    trigger: str = "manual"  # manual | schedule | request
    report_path: str = ""
    request_id: str = ""  # the operator's request it answered, if any
    # every criterion it judged, passed or failed (``failed`` names those that failed):
    # what the drill measured, which ``failoverctl doctor`` asks of the last week's drills.
    # Empty: recorded before these were kept (or a run that judged nothing).
    criteria: tuple[str, ...] = Field((), exclude_if=lambda v: not v)


# Not a scenario file: the drill service's capacity probe (docs/capacity.md), requested,
# scheduled, locked and recorded like a drill, run by the service itself on the region's
# warm pool (chaos/capacity/service.py).
CAPACITY_PROBE = "capacity-probe"
# What a schedule reserves for one in its window: two probes of ~15 steps each, the
# drains between them, the recovery measurement and the loan (a GPU wakes in seconds).
CAPACITY_PROBE_MAX_S = 1800.0


class DrillRequest(Frozen):
    """Value of ``drills/requests/<id>``: an operator asked for a drill; the drill
    service runs it (one at a time, like every drill) and deletes the request."""

    # Never run without a field a newer version added (codec.decode).
    REFUSE_UNKNOWN_ON_READ: ClassVar[bool] = True

    id: str
    scenario: str
    region: str = ""  # "" = the scenario's default
    dry_run: bool = False
    reason: str
    actor: str
    requested_at: float
    replica: str = ""  # a capacity probe's named replica (its base URL); "" = any WARM one


class ScenarioInfo(Frozen):
    name: str
    title: str = ""
    region: str = ""


class UpcomingDrill(Frozen):
    scenario: str
    region: str = ""
    at: float


class DrillCatalog(Frozen):
    """Value of ``drills/catalog``: what the drill service can run and when it will,
    republished every tick (so the API can refuse an unknown scenario)."""

    service: str
    published_at: float
    scenarios: tuple[ScenarioInfo, ...] = ()
    upcoming: tuple[UpcomingDrill, ...] = Field(default_factory=tuple)
