"""``python -m bench prefixes`` runs and prints a well-formed headline (shape only)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_small_run_prints_one_headline() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "prefixes",
            "--prompts",
            "3000",
            "--prefixes",
            "500",
            "--quiet",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1
    head = json.loads(lines[0])
    assert head["prompts_per_s"] > 0 and 0 <= head["recall_top1pct"] <= 1
    assert head["sketch_bytes"] > 0
    assert (
        set(head["goals"])
        == set(head["met"])
        == {"prompts_per_s", "recall_top1pct", "sketch_bytes"}
    )
