"""The demo: a whole Tectonic deployment on this machine and the region-blackout
drill run against it, with a live view of what the control plane does.

Everything runs as real processes on 127.0.0.1: etcd, vLLM-compatible simulators (two
per region; ``--vllm`` starts one real vLLM server per region instead), a region agent
and a session-affinity gateway per region (``--data-plane envoy``: a real Envoy per
region asking two endpoint pickers, tectonic-epp, instead), and two control-plane
replicas that elect a leader through etcd. Chat sessions with shared system prompts
talk through the gateways (or Envoys) the whole time. The drill checks the steady
state, SIGKILLs every server of us-east, watches the failover (pre-warm of the targets
with us-east's top prefixes, sessions moving once), brings the servers back, waits for
the graduated recovery, and judges what it measured. It ends with the verdict per
criterion, the data plane it ran on, and the path of the HTML report (plots, journal).
While it runs, the control plane's live dashboard is at the address printed at the
start (``dashboard: http://127.0.0.1:PORT/``), and every process but Envoy serves
Prometheus ``/metrics`` (``LocalDeployment.metrics_targets``).

    python -m chaos.lab.demo                       # about a minute with the simulator
    python -m chaos.lab.demo --vllm                # real vLLM servers (CPU build here)
    python -m chaos.lab.demo --scenario auth-503-storm
    python -m chaos.lab.demo --data-plane envoy    # Envoy + endpoint pickers
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from chaos.drills.result import DrillResult
from chaos.drills.runner import dump
from chaos.drills.scenario import find_scenario
from chaos.lab.demo_live import LiveView
from chaos.lab.run import REPORTS, add_data_plane_flag, data_plane_words, run_in_lab
from chaos.lab.spec import DataPlane, DeploymentSpec
from chaos.lab.vllm_cpu import SETUP_HINT, vllm_available
from controlplane.kernel.config import ConfigError, DegradedWhen

VLLM_DEGRADED_WHEN = DegradedWhen(error_rate_over=0.05, ttft_p99_over_s=5)


def print_verdict(result: DrillResult, live: LiveView, data_plane: DataPlane) -> None:
    print("\n== story")
    for t, msg in live.timeline:
        print(f"  t+{t:5.1f}s  {msg}")
    print(
        f"\n== verdict of {result.scenario} on {result.region}: "
        f"{'PASS' if result.passed else 'FAIL'}"
    )
    print(f"  data plane: {data_plane} ({data_plane_words(data_plane)})")
    for c in result.criteria:
        print(f"  {'PASS' if c.passed else 'FAIL'}  {c.name:<22} {c.measured}")
        print(f"        {'':<22} required: {c.required}")
    figures = ", ".join(f"{k} {v:g}" for k, v in result.figures.items())
    print(f"  figures: {figures}")
    if result.readiness_written:
        print(f"  readiness written for: {', '.join(result.readiness_written)}")
    print(f"\nreport:  {Path(result.report_path).resolve()}")
    print(f"history: {(Path(result.report_path).parent.parent / 'index.html').resolve()}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m chaos.lab.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--vllm",
        action="store_true",
        help="real vLLM servers (one per region) instead of simulators",
    )
    p.add_argument(
        "--scenario", default="region-blackout", help="drill to run (a name in chaos/scenarios/)"
    )
    p.add_argument("--sessions", type=int, default=30, help="chat sessions (default 30)")
    p.add_argument(
        "--reports", type=Path, default=REPORTS, help=f"where drill reports go (default {REPORTS}/)"
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON at the end")
    add_data_plane_flag(p)
    args = p.parse_args(argv)
    if args.sessions < 3:
        p.error("--sessions must be at least 3 (one per region)")
    if args.vllm and not vllm_available():
        p.error(f"--vllm needs a real vLLM: {SETUP_HINT}")
    spec = DeploymentSpec(
        server="vllm" if args.vllm else "simulator",
        replicas_per_region=1 if args.vllm else 2,  # ~2.3 GB each: one per region here
        # Three CPU vLLM servers share two cores with the whole lab: under the demo's
        # traffic their first-token p99 reaches seconds without anything being wrong, so
        # their regions are judged DEGRADED above 5 s (the simulator's lab: 1.5 s).
        degraded_when=VLLM_DEGRADED_WHEN if args.vllm else DeploymentSpec.degraded_when,
        data_plane=args.data_plane,
    )
    live = LiveView()
    try:
        scenario = find_scenario(args.scenario)
        result = asyncio.run(
            run_in_lab(
                scenario,
                spec=spec,
                reports=args.reports,
                sessions=args.sessions,
                say=live.say,
                on_sample=live.show,
            )
        )
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (TimeoutError, RuntimeError) as e:
        print(f"\nDEMO FAILED: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted; all demo processes stopped", file=sys.stderr)
        return 130
    print_verdict(result, live, spec.data_plane)
    if args.json:
        print(dump(result))
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
