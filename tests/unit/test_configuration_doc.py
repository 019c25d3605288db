"""docs/configuration.md's reference is the topology models' own: it is written from
them (scripts/config_reference.py), and this test fails when the file holds
another, e.g. after a field was added, renamed or given a new default or description."""

from __future__ import annotations

from pathlib import Path

from controlplane.kernel.config import Topology
from scripts.config_reference import (
    BEGIN,
    END,
    generated_part,
    render,
    sections,
    splice,
)

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"


def test_the_reference_on_disk_is_the_models_own() -> None:
    on_disk = generated_part(DOC.read_text())
    assert on_disk is not None, (
        "docs/configuration.md has no generated part: run python scripts/gen_config_docs.py"
    )
    assert on_disk == render(), (
        "docs/configuration.md differs from the topology models: "
        "run python scripts/gen_config_docs.py"
    )


def test_every_field_of_every_section_is_listed() -> None:
    text = render()
    for section in sections(Topology):
        for name in section.model.model_fields:
            path = f"{section.path}.{name}" if section.path else name
            assert f"| `{path}` |" in text, path
    paths = [s.path for s in sections(Topology)]
    assert {"etcd", "regions[]", "regions[].slo", "security.tokens[]"} <= set(paths)


def test_a_nested_default_that_differs_from_the_models_is_said() -> None:
    # RegionConfig.slo defaults to CapacitySLO(ttft_p99_s=2.0); in the section the
    # field is required.
    row = next(line for line in render().splitlines() if "`regions[].slo.ttft_p99_s`" in line)
    assert "required (without the section: `2.0`)" in row


def test_splice_keeps_the_hand_written_part() -> None:
    part = render()
    doc = "# Title\n\nprose\n\n" + BEGIN + "\nold\n" + END + "\n\nafter\n"
    spliced = splice(doc, part)
    assert spliced.startswith("# Title\n\nprose\n\n")
    assert spliced.endswith("\nafter\n")
    assert generated_part(spliced) == part
    assert generated_part(splice("# Only prose\n", part)) == part
