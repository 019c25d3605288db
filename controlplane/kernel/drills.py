"""What the control plane knows of chaos drills (docs/architecture.md §6): values under
``drills/`` in etcd, written by the drill service (chaos/drills/service.py) and the API,
read by both and by ``failoverctl drill``. The drills themselves live in ``chaos/``."""

from __future__ import annotations

from pydantic import Field

from controlplane.kernel.model import Frozen

SCENARIO_NAME = r"^[a-z0-9][a-z0-9-]{0,62}$"


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


class DrillRequest(Frozen):
    """Value of ``drills/requests/<id>``: an operator asked for a drill; the drill
    service runs it (one at a time, like every drill) and deletes the request."""

    id: str
    scenario: str
    region: str = ""  # "" = the scenario's default
    dry_run: bool = False
    reason: str
    actor: str
    requested_at: float


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
