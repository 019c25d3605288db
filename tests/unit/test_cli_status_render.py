"""failoverctl status while etcd refuses writes: each region's state reads UNKNOWN with
the stored one beside it, and the title says why; an older server's answer (no store
field) renders as before."""

from __future__ import annotations

from rich.console import Console
from tectonic_api.v1 import controlplane_pb2 as pb

from controlplane.cli import render


def rendered(st: pb.StatusResponse) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(render.status_table(st))
    return console.export_text()


def test_unknown_states_and_the_refusal_are_shown() -> None:
    st = pb.StatusResponse(
        regions=[
            pb.RegionStatus(name="us-east", state=pb.REGION_STATE_UNKNOWN, stored_state=pb.NORMAL)
        ],
        store=pb.StoreWrites(writable=False, reason="etcd alarm NOSPACE", alarms=["NOSPACE"]),
    )
    text = rendered(st)
    assert "UNKNOWN (stored: NORMAL)" in text
    assert "ETCD REFUSES WRITES" in text and "etcd alarm NOSPACE" in text


def test_an_answer_without_the_store_field_renders_as_before() -> None:
    st = pb.StatusResponse(regions=[pb.RegionStatus(name="us-east", state=pb.FAILING_OVER)])
    text = rendered(st)
    assert "FAILING_OVER" in text and "REFUSES" not in text
