"""``python -m bench store`` runs end to end with tiny settings and prints a well-formed
headline: etcd's database sampled, the bytes written read from etcd by writer, the
leader's compactions matching etcd's own compact revision, and the run without
compaction that never compacts. Shape and sanity only: whether the goals are met is
for the bench to report at its defaults, never for a test on a shared machine."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.lab.local_etcd import etcd_available
from chaos.lab.spec import REGIONS

pytestmark = [pytest.mark.slow, pytest.mark.etcd]
REPO = Path(__file__).resolve().parent.parent
ARGS = (
    *("--duration-s", "24", "--retention-s", "4", "--compact-interval-s", "1"),
    *("--without-compaction-s", "10", "--sessions", "9", "--sample-s", "1", "--quiet"),
)


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def test_tiny_store_bench_prints_a_sane_headline() -> None:
    if not etcd_available():
        pytest.fail("the etcd binary is not installed: run scripts/setup.sh")
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "store", *ARGS],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout  # --quiet: only the headline
    head = json.loads(lines[0])
    assert head["bench"] == "store"
    assert head["retention_s"] == 4 and head["compact_interval_s"] == 1
    assert head["sessions"] == 9 and head["requests_ok"] > 0

    # etcd's own figures
    for name in ("db_mb_start", "db_mb_first_window", "db_mb_after", "db_mb_max"):
        assert _positive(head[name]), name
    assert head["db_mb_max"] >= head["db_mb_after"] >= head["db_mb_start"]
    assert isinstance(head["db_growth_mb_per_min"], float)
    assert head["etcd_alarms"] == []

    # who wrote what, from the watch
    assert head["watch_gaps"] == [] and head["watched_events"] > 0
    gateways = head["write_bytes_per_s_gateway"]
    assert set(REGIONS) <= set(gateways) and all(_positive(gateways[r]) for r in REGIONS)
    assert _positive(head["write_bytes_per_s_leader"])
    by_writer = head["write_bytes_per_s_by_writer"]
    assert by_writer["leader"] == head["write_bytes_per_s_leader"]
    assert math.isclose(sum(by_writer.values()), head["write_bytes_per_s_total"], abs_tol=1)
    assert math.isclose(sum(gateways.values()), by_writer["gateway"], abs_tol=1)
    assert _positive(head["written_mb"])

    # compaction: the leader's count against etcd's own compact revision
    assert head["compactions"] >= 1
    assert 0 < head["compacted_revision"] <= head["etcd_compact_revision"]
    assert head["payloads_dropped"] >= 0
    assert head["payloads_dropped_source"] in ("gateways' /metrics", "absent")

    # the lab again, never compacting: etcd's history is never compacted
    bare = head["without_compaction"]
    assert bare["retention_s"] == 0 and bare["compactions"] == 0
    assert bare["etcd_compact_revision"] == -1  # etcd's: never compacted
    assert bare["db_mb_after"] > bare["db_mb_start"]
    assert head["db_growth_mb_per_min_without_compaction"] == bare["db_growth_mb_per_min"]

    assert set(head["goals"]) == set(head["met"]) == {"db_growth_mb_per_min", "payloads_dropped"}
    assert all(isinstance(v, bool) for v in head["met"].values())
