"""Copy the alert rules and the Grafana dashboard into the Helm chart.

    python scripts/sync_chart_monitoring.py           # copy what differs
    python scripts/sync_chart_monitoring.py --check   # exit 1 if a copy is out of date

runbooks/ holds the one source (runbooks/alerts/tectonic-alerts.yaml,
runbooks/grafana/tectonic-dashboard.json); Helm reads only files inside the chart
(``.Files.Get``), so deploy/helm/tectonic/files/ holds byte-for-byte copies, from which
the chart renders its PrometheusRule and dashboard ConfigMap (``monitoring`` values).
Edit the sources, never the copies: tests/integration/test_helm_chart_monitoring.py
fails while a copy differs from its source.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHART_FILES = ROOT / "deploy" / "helm" / "tectonic" / "files"
# source -> the chart's copy
COPIES: dict[Path, Path] = {
    ROOT / "runbooks" / "alerts" / "tectonic-alerts.yaml": CHART_FILES / "tectonic-alerts.yaml",
    ROOT / "runbooks" / "grafana" / "tectonic-dashboard.json": (
        CHART_FILES / "tectonic-dashboard.json"
    ),
}


def stale() -> list[tuple[Path, Path]]:
    """(source, copy) of every copy that is missing or differs from its source."""
    return [
        (source, copy)
        for source, copy in COPIES.items()
        if not copy.is_file() or copy.read_bytes() != source.read_bytes()
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="only say whether the copies are current")
    args = p.parse_args()
    out_of_date = stale()
    if not out_of_date:
        print(f"{CHART_FILES.relative_to(ROOT)} is up to date")
        return 0
    for source, copy in out_of_date:
        if args.check:
            state = "differs from" if copy.is_file() else "is missing, the copy of"
            print(
                f"{copy.relative_to(ROOT)} {state} {source.relative_to(ROOT)}: "
                "run python scripts/sync_chart_monitoring.py"
            )
        else:
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_bytes(source.read_bytes())
            print(f"copied {source.relative_to(ROOT)} to {copy.relative_to(ROOT)}")
    return 1 if args.check else 0


if __name__ == "__main__":
    sys.exit(main())
