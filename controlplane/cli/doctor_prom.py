"""``failoverctl doctor --prometheus URL``: the history the RPCs do not hold.

A thin adapter: a few instant queries on Prometheus's HTTP API (``GET /api/v1/query``)
turned into :class:`~controlplane.cli.doctor.PromFacts`; the judging is
``controlplane/cli/doctor.py``'s (pure). Two questions read it:

* 2: each pool's wake (WARM -> ACTIVE) p95 over up to 90 days, from the agents'
  histogram ``tectonic_agent_pool_activation_duration_seconds{region, kind="wake"}``
  (``region`` is the agent's unit; ``kind="resume"``, IDLE -> ACTIVE, is not a cold
  start and is left out, as the agent's own p95 leaves it out);
* 8: each pool's, zone's and the fleet's highest budget utilisation in the last 7 days,
  from the leader's gauge ``tectonic_budget_utilisation{scope, name}``, and the highest
  while no lift or failover's allowance let the scope spend past its budget (its gauge
  ``tectonic_budget_allowed`` not 1).

Each comes with how far back Prometheus's samples of it go (:func:`seen_query`): its
retention, or when it started scraping, may hold far less than the window asked. A
Prometheus that cannot be reached, or answers an error, leaves the question's part a
reason (a ``str``), never a crash and never an empty answer taken for a pass.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from controlplane.cli.doctor import PromActivation, PromBudget, PromFacts

ACTIVATION = "tectonic_agent_pool_activation_duration_seconds"
BUDGET = "tectonic_budget_utilisation"
ALLOWED = "tectonic_budget_allowed"
ACTIVATION_WINDOW, BUDGET_WINDOW = "90d", "7d"
WAKES = f'{ACTIVATION}_count{{kind="wake"}}'


def seen_query(series: str, by: str, window: str, step: str) -> str:
    """Seconds since the oldest sample of ``series`` within ``window``, per ``by``: the
    earliest ``timestamp()`` of a subquery over the window. A subquery's steps are
    aligned to multiples of ``step`` since the epoch, so a coarse one (cheap over 90
    days) misses data younger than its last step and places the oldest sample up to a
    step late; a fine one (1 s steps) over the last hour fills that in. ``label_replace``
    keeps the two apart for ``or``; the outer ``min`` takes the earlier of them. The
    age is Prometheus's clock (``time()``), not this machine's."""
    coarse = f"min_over_time(timestamp({series})[{window}:{step}])"
    fine = f"min_over_time(timestamp({series})[1h:1s])"
    return (
        f"time() - min by ({by}) ("
        f'label_replace({coarse}, "doctor_step", "coarse", "", "") or '
        f'label_replace({fine}, "doctor_step", "fine", "", ""))'
    )


# 2: the wake p95 of the increase over the window (counter resets, e.g. an agent's
# restart, are what increase() handles), the wakes it is of, and how far back it sees
ACTIVATION_P95 = (
    f"histogram_quantile(0.95, sum by (le, region) "
    f'(increase({ACTIVATION}_bucket{{kind="wake"}}[{ACTIVATION_WINDOW}])))'
)
ACTIVATION_WAKES = f"sum by (region) (increase({WAKES}[{ACTIVATION_WINDOW}]))"
ACTIVATION_SEEN = seen_query(WAKES, "region", ACTIVATION_WINDOW, "1h")
# 8: the week's peak per scope (several leaders over the week: the highest of theirs)
BUDGET_MAX = f"max by (scope, name) (max_over_time({BUDGET}[{BUDGET_WINDOW}]))"
BUDGET_SEEN = seen_query(BUDGET, "scope, name", BUDGET_WINDOW, "10m")
# the peak while nothing allowed spending past the budget: the gauge where the leader's
# tectonic_budget_allowed is not 1, sampled by a subquery (1 min steps over the week,
# and 1 s over the last hour, as seen_query does: a coarse step misses what is younger
# than it). With no tectonic_budget_allowed at all (an older leader) ``unless`` keeps
# every sample, and BUDGET_ALLOWED_SEEN says the gauge was not there to judge by.
_UNALLOWED = f"({BUDGET} unless on (scope, name) ({ALLOWED} == 1))"
_COARSE = f"max_over_time({_UNALLOWED}[{BUDGET_WINDOW}:1m])"
_FINE = f"max_over_time({_UNALLOWED}[1h:1s])"
BUDGET_MAX_UNALLOWED = (
    f'max by (scope, name) (label_replace({_COARSE}, "doctor_step", "coarse", "", "") or '
    f'label_replace({_FINE}, "doctor_step", "fine", "", ""))'
)
BUDGET_ALLOWED_SEEN = f"max by (scope, name) (max_over_time({ALLOWED}[{BUDGET_WINDOW}]))"


class PromError(Exception):
    """Prometheus could not be asked, or answered an error."""


def query(url: str, expr: str, timeout_s: float) -> list[tuple[dict[str, str], float]]:
    """``expr``'s instant vector now: (labels, value) per series; NaN stays NaN."""
    target = f"{url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    try:
        with urllib.request.urlopen(target, timeout=timeout_s) as r:
            raw = r.read()
    except urllib.error.HTTPError as e:  # Prometheus answers its errors with a JSON body
        raw = e.read()
        if not raw:
            raise PromError(f"HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        why = e.reason if isinstance(e, urllib.error.URLError) else e
        raise PromError(f"unreachable: {why}") from None
    try:
        body: dict[str, Any] = json.loads(raw)
    except ValueError:
        raise PromError(f"not Prometheus's API: {raw[:80]!r}") from None
    if body.get("status") != "success":
        raise PromError(f"{body.get('errorType', 'error')}: {body.get('error', body)}")
    data = body.get("data") or {}
    if data.get("resultType") != "vector":
        raise PromError(f"answered a {data.get('resultType')}, not a vector")
    return [(dict(s["metric"]), float(s["value"][1])) for s in data.get("result", [])]


def _value(v: float) -> float | None:
    return None if math.isnan(v) or math.isinf(v) else v


def read_activation(url: str, timeout_s: float) -> dict[str, PromActivation] | str:
    try:
        p95 = {m.get("region", ""): v for m, v in query(url, ACTIVATION_P95, timeout_s)}
        wakes = {m.get("region", ""): v for m, v in query(url, ACTIVATION_WAKES, timeout_s)}
        seen = {m.get("region", ""): v for m, v in query(url, ACTIVATION_SEEN, timeout_s)}
    except PromError as e:
        return str(e)
    return {
        unit: PromActivation(
            p95_s=_value(p95.get(unit, math.nan)),
            wakes=_value(wakes.get(unit, math.nan)) or 0.0,
            seen_s=_value(seen.get(unit, math.nan)),
        )
        for unit in wakes.keys() | seen.keys()
    }


def read_budget(url: str, timeout_s: float) -> dict[tuple[str, str], PromBudget] | str:
    try:
        peak = {
            (m.get("scope", ""), m.get("name", "")): v for m, v in query(url, BUDGET_MAX, timeout_s)
        }
        seen = {
            (m.get("scope", ""), m.get("name", "")): v
            for m, v in query(url, BUDGET_SEEN, timeout_s)
        }
        unallowed = {
            (m.get("scope", ""), m.get("name", "")): v
            for m, v in query(url, BUDGET_MAX_UNALLOWED, timeout_s)
        }
        judged = {
            (m.get("scope", ""), m.get("name", ""))
            for m, _ in query(url, BUDGET_ALLOWED_SEEN, timeout_s)
        }
    except PromError as e:
        return str(e)
    return {
        key: PromBudget(
            max_utilisation=v,
            seen_s=_value(seen.get(key, math.nan)),
            # every sample under an allowance: 0 outside one; no gauge at all: not known
            max_unallowed=_value(unallowed.get(key, 0.0)) if key in judged else None,
        )
        for key, v in peak.items()
        if _value(v) is not None
    }


def read_prometheus(url: str, timeout_s: float) -> PromFacts:
    """Both questions' history; each part a reason where Prometheus did not answer."""
    activation = read_activation(url, timeout_s)
    if isinstance(activation, str) and activation.startswith("unreachable"):
        return PromFacts(url=url, activation=activation, budget=activation)  # no 2nd wait
    return PromFacts(url=url, activation=activation, budget=read_budget(url, timeout_s))
