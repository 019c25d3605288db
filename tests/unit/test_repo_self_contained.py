"""Nothing in the repository points outside it: a user's clone has no team notes, no
original design page and no machine paths, so a README line or a comment citing them
sends the reader nowhere. Docs cite docs/ (docs/architecture.md for the design)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Built from parts so that this file does not match itself.
OUTSIDE = (
    "../" + "shared",
    "/work/" + "shared",
    "DESIGN" + ".md",
    "DESIGN" + " §",
    "notes" + "/vllm",
)


def tracked_text_files() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [ROOT / n for n in names if (ROOT / n).is_file()]


def test_no_file_points_outside_the_repository() -> None:
    found = []
    for path in tracked_text_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # binary
        for n, line in enumerate(text.splitlines(), 1):
            if any(o in line for o in OUTSIDE):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not found, "points outside the repository:\n" + "\n".join(found)


def test_architecture_sections_cited_exist() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    headings = {line.split()[1].rstrip(".") for line in doc.splitlines() if line.startswith("## ")}
    habits = {f"7.{n}" for n in range(1, 9)}  # §7's numbered habits
    cited = set()
    for path in tracked_text_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        cited.update(re.findall(r"architecture\.md §(\d+(?:\.\d+)?)", text))
    assert cited, "no file cites docs/architecture.md"
    assert cited <= headings | habits, f"cited sections missing: {cited - headings - habits}"
