"""The committed gRPC stubs must match what scripts/gen_protos.sh makes from proto/."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from grpc_tools import protoc

REPO = Path(__file__).resolve().parent.parent
PROTO = REPO / "proto"


def test_committed_stubs_are_fresh(tmp_path: Path) -> None:
    # Tectonic's own API, and KEDA's external scaler interface (vendored, see its README)
    sources = sorted(
        [*PROTO.glob("tectonic_api/v1/*.proto"), *PROTO.glob("externalscaler/*.proto")]
    )
    assert sources, "no .proto files found"
    rel = [str(p.relative_to(PROTO)) for p in sources]
    well_known = resources.files("grpc_tools") / "_proto"
    rc = protoc.main(
        [
            "protoc",
            f"-I{PROTO}",
            f"-I{well_known}",
            f"--python_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            *rel,
        ]
    )
    assert rc == 0
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.py*"))
    assert generated
    stale = [str(g) for g in generated if (PROTO / g).read_bytes() != (tmp_path / g).read_bytes()]
    assert not stale, f"stale stubs {stale}: run scripts/gen_protos.sh and commit the result"
