"""``doctor --prometheus``'s adapter (controlplane/cli/doctor_prom.py) against a fake
HTTP API: an answer parsed, an error and an unreachable Prometheus a reason, never a
crash. (A real Prometheus: tests/integration/test_failoverctl_doctor_prometheus.py.)"""

from __future__ import annotations

import json
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from controlplane.cli import doctor_prom as dp
from controlplane.cli.doctor import PromBudget


def vector(*series: tuple[dict[str, str], str]) -> dict[str, object]:
    result = [{"metric": m, "value": [1.0, v]} for m, v in series]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


ANSWERS: dict[str, tuple[int, dict[str, object]]] = {
    dp.ACTIVATION_P95: (200, vector(({"region": "east"}, "0.24"), ({"region": "west"}, "NaN"))),
    dp.ACTIVATION_WAKES: (200, vector(({"region": "east"}, "4"), ({"region": "west"}, "0"))),
    dp.ACTIVATION_SEEN: (200, vector(({"region": "east"}, "3600"))),
    dp.BUDGET_MAX: (400, {"status": "error", "errorType": "bad_data", "error": "parse error"}),
}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        q = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)["query"][0]
        code, body = ANSWERS.get(q, (200, vector()))
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_answers_parsed_and_an_error_is_a_reason(url: str) -> None:
    got = dp.read_prometheus(url, 2.0)
    assert not isinstance(got.activation, str)
    east, west = got.activation["east"], got.activation["west"]
    assert (east.p95_s, east.wakes, east.seen_s) == (0.24, 4.0, 3600.0)
    assert west.p95_s is None and west.wakes == 0 and west.seen_s is None
    assert got.budget == "bad_data: parse error"


def test_the_weeks_peak_with_and_without_the_allowances(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """east: 130 % at its peak, 90 % outside its allowances; the fleet: every sample
    allowed (none outside: 0); zone us: no tectonic_budget_allowed (an older leader)."""
    s = (
        {"scope": "pool", "name": "east"},
        {"scope": "fleet", "name": "fleet"},
        {"scope": "zone", "name": "us"},
    )
    answers = ANSWERS | {
        dp.BUDGET_MAX: (200, vector((s[0], "1.3"), (s[1], "1.1"), (s[2], "1.2"))),
        dp.BUDGET_SEEN: (200, vector((s[0], "600"))),
        dp.BUDGET_MAX_UNALLOWED: (200, vector((s[0], "0.9"), (s[2], "1.2"))),
        dp.BUDGET_ALLOWED_SEEN: (200, vector((s[0], "1"), (s[1], "1"))),
    }
    monkeypatch.setattr(sys.modules[__name__], "ANSWERS", answers)
    got = dp.read_budget(url, 2.0)
    assert not isinstance(got, str)
    assert got[("pool", "east")] == PromBudget(1.3, 600.0, max_unallowed=0.9)
    assert got[("fleet", "fleet")] == PromBudget(1.1, None, max_unallowed=0.0)
    assert got[("zone", "us")] == PromBudget(1.2, None, max_unallowed=None)


def test_unreachable_is_a_reason_for_both() -> None:
    got = dp.read_prometheus("http://127.0.0.1:1", 1.0)
    assert isinstance(got.activation, str) and got.activation.startswith("unreachable")
    assert got.budget == got.activation


def test_the_queries_read_the_metrics_the_agent_and_leader_export() -> None:
    assert 'tectonic_agent_pool_activation_duration_seconds_bucket{kind="wake"}[90d]' in (
        dp.ACTIVATION_P95
    )
    assert dp.BUDGET_MAX == "max by (scope, name) (max_over_time(tectonic_budget_utilisation[7d]))"
    unallowed = (
        "(tectonic_budget_utilisation unless on (scope, name) (tectonic_budget_allowed == 1))"
    )
    assert f"max_over_time({unallowed}[7d:1m])" in dp.BUDGET_MAX_UNALLOWED
    assert f"max_over_time({unallowed}[1h:1s])" in dp.BUDGET_MAX_UNALLOWED
    assert "[90d:1h]" in dp.ACTIVATION_SEEN and "[1h:1s]" in dp.ACTIVATION_SEEN
