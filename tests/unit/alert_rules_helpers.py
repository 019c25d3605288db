"""The files of runbooks/ the alert tests read (tests/unit/test_alert_*.py): the alert
rules, their promtool cases, the Grafana dashboard and the runbook pages, and where a
runbook link leads (the page, and the anchor GitHub derives from its headings).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
RUNBOOKS = REPO / "runbooks"
RULES = RUNBOOKS / "alerts" / "tectonic-alerts.yaml"
RULE_CASES = RUNBOOKS / "alerts" / "tectonic-alerts.test.yaml"  # promtool test rules
DASHBOARD = RUNBOOKS / "grafana" / "tectonic-dashboard.json"
# The one base of every runbook link (runbooks/README.md says how to change it).
BASE = "https://github.com/tectonic/tectonic/blob/main/runbooks/"


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings (lower case, punctuation dropped,
    spaces to hyphens, repeats numbered)."""
    seen: dict[str, int] = {}
    anchors = set()
    in_fence = False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        m = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if in_fence or not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def runbook_pages() -> list[Path]:
    return sorted(RUNBOOKS.glob("*.md"))


def page_target_problems(url: str, where: str) -> list[str]:
    """A link ``page.md#anchor`` (relative to runbooks/) that leads nowhere."""
    page, _, anchor = url.partition("#")
    path = RUNBOOKS / page
    if not path.is_file():
        return [f"{where}: {page} does not exist in runbooks/"]
    if anchor and anchor not in github_anchors(path.read_text()):
        return [f"{where}: {page} has no heading with anchor #{anchor}"]
    return []


def load_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    names = [g["name"] for g in doc["groups"]]
    assert len(names) == len(set(names)), f"repeated group names: {names}"
    return [rule for group in doc["groups"] for rule in group["rules"]]
