"""failoverctl's CBU figure: coloured by the topology's thresholds as the alerts judge
(strictly above warn_cbu a warning, strictly above page_cbu past what it bears), with
where the capacity comes from when it is not a fresh probe."""

from __future__ import annotations

import math

import pytest
from rich.console import Console
from tectonic_api.v1 import controlplane_pb2 as pb

from controlplane.cli import render


def bearing(cbu: float, source: str = "measured") -> pb.RegionCapacity:
    return pb.RegionCapacity(source=source, cbu=cbu, warn_cbu=0.8, page_cbu=1.0)


@pytest.mark.parametrize(
    ("cbu", "style"),
    [(0.0, "green"), (0.8, "green"), (0.81, "yellow"), (1.0, "yellow"), (1.01, "bold red")],
)
def test_cbu_is_coloured_by_the_warn_and_page_thresholds(cbu: float, style: str) -> None:
    assert render.cbu_style(bearing(cbu)) == style
    assert render.cbu_text(bearing(cbu)) == f"[{style}]{cbu:.2f}[/]"


def test_thresholds_come_from_the_answer_not_from_failoverctl() -> None:
    strict = pb.RegionCapacity(source="measured", cbu=0.7, warn_cbu=0.6, page_cbu=0.65)
    assert render.cbu_style(strict) == "bold red"


def test_a_region_that_bears_nothing_and_the_capacitys_source_are_said() -> None:
    assert render.cbu_text(bearing(math.inf)) == "[bold red]∞[/]"
    assert render.cbu_text(bearing(0.5, "stale")) == "[green]0.50[/] [yellow](stale)[/]"
    assert render.cbu_text(bearing(0.5, "typed")) == "[green]0.50[/] [dim](typed)[/]"


def test_the_status_table_has_a_cbu_column() -> None:
    st = pb.StatusResponse(
        leader="cp-a",
        regions=[
            pb.RegionStatus(name="east", state=pb.NORMAL, capacity=bearing(1.25)),
            pb.RegionStatus(name="west", state=pb.NORMAL),  # an older replica: no capacity
        ],
    )
    console = Console(width=200, record=True, color_system=None)
    console.print(render.status_table(st))
    lines = console.export_text().splitlines()
    header = [c.strip() for c in next(li for li in lines if "region" in li).split("┃")]
    rows = {r[1]: r for li in lines if li.startswith("│") for r in [li.split("│")]}
    rows = {name.strip(): [c.strip() for c in cells] for name, cells in rows.items()}
    col = header.index("cbu")
    assert rows["east"][col] == "1.25" and rows["west"][col] == "-"
