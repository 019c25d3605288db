"""The runbook pages in runbooks/, against each other and the code.

* Every link between the pages leads to a page and heading that exist (GitHub's
  anchors, derived from the page's headings).
* Every ``failoverctl`` command the runbooks show exists, with the options shown
  (from the Typer app itself). A command marked "(coming)" on its line may not exist
  yet; once it does, it is checked like the others.

This only parses the commands; ``tests/integration/test_runbook_commands.py`` runs each
of them (``failoverctl_commands`` collects them for it) against a lab: placeholders
filled, every one exiting 0 or with the refusal it lists, the fragments that are no
whole command (prose naming one) in a short list there.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from typing import Any

import typer.main

from controlplane.cli.failoverctl import app as failoverctl_app
from tests.unit.alert_rules_helpers import (
    BASE,
    RUNBOOKS,
    github_anchors,
    page_target_problems,
    runbook_pages,
)

# ---- Markdown: GitHub's anchors and the runbook pages ---------------------------------


def test_github_anchors() -> None:
    md = "# Runbook: a region failed over (FAILING_OVER)\n## Alerts\n```\n# not\n```\n## Alerts\n"
    assert github_anchors(md) == {
        "runbook-a-region-failed-over-failing_over",
        "alerts",
        "alerts-1",
    }


def test_runbook_links_between_pages_lead_somewhere() -> None:
    problems = []
    for page in runbook_pages():
        text = page.read_text()
        for m in re.finditer(r"\]\(([^)\s]+)\)", text):
            target = m.group(1)
            if target.startswith(("http://", "https://")):
                if target.startswith(BASE):
                    problems += page_target_problems(target[len(BASE) :], page.name)
                continue
            if target.startswith("#"):
                target = page.name + target
            if target.split("#")[0].endswith(".md"):
                problems += page_target_problems(target, page.name)
            elif not (RUNBOOKS / target.split("#")[0]).exists():
                problems.append(f"{page.name}: {target} does not exist")
    assert problems == []


# ---- failoverctl commands in the runbooks -------------------------------------------


# ;, && or | outside double quotes (an even number of quotes follows)
_SHELL_SEPARATOR = re.compile(r'(?:;|&&|\|)(?=(?:[^"]*"[^"]*")*[^"]*$)')


def failoverctl_commands(markdown: str) -> Iterator[tuple[int, str, bool]]:
    """(line number, command, marked coming) for each ``failoverctl ...`` in a code span."""
    lines = markdown.splitlines()
    for m in re.finditer(r"`([^`]+)`", markdown):
        span = " ".join(m.group(1).split())
        first = markdown.count("\n", 0, m.start())
        last = markdown.count("\n", 0, m.end())
        coming = any("(coming" in lines[i] for i in range(first, last + 1))
        for piece in _SHELL_SEPARATOR.split(span):
            piece = piece.strip()
            if re.match(r"^(\S*/)?failoverctl(\s|$)", piece):
                yield first + 1, piece, coming


def failoverctl_root() -> Any:
    """failoverctl's command tree: a click-style group (Typer vendors its own click, so
    it is read by its attributes: ``commands``, ``params``, ``opts``, ``is_flag``)."""
    return typer.main.get_group(failoverctl_app)


def command_problem(root: Any, command: str) -> str | None:
    """Why ``command`` would not parse as shown (unknown command or option), or None."""
    try:
        words = shlex.split(command)[1:]
    except ValueError as e:
        return f"cannot split: {e}"
    cmd, path = root, "failoverctl"
    while words and hasattr(cmd, "commands"):
        word = words[0]
        if word.startswith("-"):
            option = _option(cmd, word)
            if option is None:
                return f"{path} has no option {word}"
            takes_value = not (word == "--help" or option.is_flag or "=" in word)
            words = words[2 if takes_value else 1 :]
            continue
        if word not in cmd.commands:
            return f"no command {word!r}"
        cmd, path, words = cmd.commands[word], f"{path} {word}", words[1:]
    for word in words:
        if word.startswith("-") and word != "-" and _option(cmd, word) is None:
            return f"{path} has no option {word}"
    return None


def _option(cmd: Any, word: str) -> Any:
    flag = word.split("=", 1)[0]
    for p in cmd.params:
        if p.param_type_name == "option" and flag in (*p.opts, *p.secondary_opts):
            return p
    return "help" if flag == "--help" else None


def test_the_command_reader() -> None:
    root = failoverctl_root()
    assert command_problem(root, "failoverctl history --region R --limit 30") is None
    assert command_problem(root, 'failoverctl --server a:1 failover R --to T -r "x y"') is None
    assert command_problem(root, "failoverctl sessions pin S --region R --reason x") is None
    assert command_problem(root, "failoverctl histry") == "no command 'histry'"
    assert command_problem(root, "failoverctl history --regoin R") == (
        "failoverctl history has no option --regoin"
    )
    assert command_problem(root, "failoverctl --help") is None
    md = (
        'Run `failoverctl status; failoverctl pause -r "a; b"`\n'
        "and `failoverctl readiness` (coming).\n"
    )
    assert list(failoverctl_commands(md)) == [
        (1, "failoverctl status", False),
        (1, 'failoverctl pause -r "a; b"', False),
        (2, "failoverctl readiness", True),
    ]


def test_runbooks_show_only_failoverctl_commands_that_exist() -> None:
    root = failoverctl_root()
    problems, seen = [], 0
    for page in runbook_pages():
        for line, command, coming in failoverctl_commands(page.read_text()):
            seen += 1
            why = command_problem(root, command)
            if why is None or (coming and why.startswith("no command")):
                continue
            problems.append(f"{page.name}:{line}: {command!r}: {why}")
    assert seen > 20
    assert problems == []
