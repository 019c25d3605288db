"""The demo's summary and verdict, from its timeline and figures."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

EXPECTED_PATH = ["NORMAL->FAILING_OVER", "FAILING_OVER->RECOVERED", "RECOVERED->NORMAL"]


def problems(figures: Mapping[str, object], victim: str) -> list[str]:
    """Why the demo failed; empty when it passed."""
    out = []
    if figures.get("transitions") != EXPECTED_PATH:
        out.append(f"{victim} took the path {figures.get('transitions')}")
    if not figures.get("sessions_moved"):
        out.append("no session moved")
    if figures.get("moved_outside_victim"):
        out.append(f"{figures['moved_outside_victim']} sessions not homed in {victim} moved")
    if figures.get("sessions_moved") != figures.get("victim_sessions"):
        out.append(
            f"{figures.get('sessions_moved')} of {figures.get('victim_sessions')} "
            f"{victim} sessions moved"
        )
    pre = figures.get("prewarm")
    if not isinstance(pre, dict) or not pre.get("prefixes_total"):
        out.append("the failover pre-warmed nothing")
    elif pre.get("attained_fraction", 0) < 1:
        out.append(f"pre-warm attained {pre.get('attained_fraction', 0):.0%} of its prefixes")
    if figures.get("bounces"):
        out.append(f"{figures['bounces']} sessions moved twice or bounced back")
    if figures.get("violations"):
        out.append(f"{figures['violations']} requests after a move served by another region")
    if figures.get("gateway_consistency_violations"):
        out.append(
            f"the gateways counted {figures['gateway_consistency_violations']:g} consistency "
            "violations"
        )
    return out


def _counts(d: object) -> str:
    assert isinstance(d, dict)
    return ", ".join(f"{k} {v}" for k, v in d.items()) or "none"


def print_summary(
    timeline: Sequence[tuple[float, str]],
    f: Mapping[str, object],
    failed: Sequence[str],
    victim: str,
) -> None:
    print("\n== summary")
    for t, msg in timeline:
        print(f"  t+{t:5.1f}s  {msg}")
    print(
        f"  figures: detect {f['detect_s']}s, failover {f['failover_s']}s, sessions moved "
        f"{f['sessions_moved_s']}s, leader takeover {f['leader_takeover_s']}s, "
        f"recovery {f['recovery_s']}s"
    )
    print(
        f"  {victim} path: {' , '.join(f['transitions'])}"  # type: ignore[arg-type]
        f"  ({f['audit_entries']} audit entries)"
    )
    window = f["failure_window"]
    when = f" between t+{window[0]}s and t+{window[1]}s" if window else ""  # type: ignore[index]
    print(
        f"  traffic: {f['requests']} requests, {f['requests_ok']} ok, "
        f"{f['requests_failed']} failed{when}"
    )
    if f["requests_failed"]:
        print(f"    failed by home region: {_counts(f['failed_by_home'])}")
        print(f"    why: {_counts(f['failure_reasons'])}")
    print(
        f"  sessions: {f['sessions']}; moved {f['sessions_moved']} of the "
        f"{f['victim_sessions']} homed in {victim} (homes of the moved: "
        f"{_counts(f['moved_by_home'])}; now on {_counts(f['moved_to'])})"
    )
    print(
        f"  sticky: {f['bounces']} sessions moved more than once or bounced back to "
        f"{victim}; {f['violations']} violations (requests after a session's move served "
        "by another region than the one it moved to)"
    )
    print(
        f"  new {victim} sessions after recovery: {f['late_sessions_at_home']} of "
        f"{f['late_sessions']} served by {victim} only"
    )
    print(
        f"  re-pins: {f['cp_sessions_repinned']} by the control plane in the background "
        f"(audited), {f['gateway_session_moves']:g} lazily by the gateways; the gateways "
        f"counted {f['gateway_consistency_violations']:g} consistency violations and "
        f"{f['gateway_retries']:g} retries on another replica"
    )
    print(f"  sessions by serving region at the end: {_counts(f['sessions_by_region_end'])}")
    print(f"  verdict: {'PASS' if not failed else 'FAIL: ' + '; '.join(failed)}")
