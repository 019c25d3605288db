"""``python -m bench epp`` runs end to end and prints a well-formed headline.

A small run on real processes (etcd, two simulators, the picker, four real Envoys, the
gateway); figures are checked for shape and sanity only: whether the goals are met is
for the bench to report, never for a test on a noisy machine. The profile summary is
checked on samples written here (py-spy is not a dependency).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench import epp_profile

REPO = Path(__file__).resolve().parent.parent
HEADLINE = {
    "added_ms_p50_header",
    "added_ms_p99_header",
    "added_ms_p50_body",
    "throughput_ratio_header",
    "throughput_ratio_body",
    "picker_cpu_ms_per_request_header",
    "picker_cpu_ms_per_request_body",
    "gateway_cpu_ms_per_request",
}
PROCESSES = {"envoy", "gateway", "load_generator", "picker", "simulators"}


@pytest.mark.slow
@pytest.mark.etcd
def test_small_run_prints_one_headline_with_sane_figures() -> None:
    small = ["--requests", "30", "--throughput-requests", "100", "--blocks", "2"]
    out = subprocess.run(
        [sys.executable, "-m", "bench", "epp", *small, "--quiet"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1
    head = json.loads(lines[0])
    assert head["bench"] == "epp"
    assert head["requests_per_path"] == {"latency": 60, "throughput": 200}
    for key in HEADLINE:
        assert isinstance(head[key], int | float) and math.isfinite(head[key]), key
    assert head["throughput_ratio_header"] > 0 and head["throughput_ratio_body"] > 0
    assert set(head["paths"]) == {"header", "body", "full_duplex", "gateway"}
    for path, figures in head["paths"].items():
        assert len(figures["throughput_ratio_rounds"]) == 2, path
        assert set(figures["cpu_ms_per_request"]) == PROCESSES, path
    # each path's own processes worked for it: the picker on the picker's paths, the
    # gateway on its own, Envoy on every path but the gateway's
    for path in ("header", "body", "full_duplex"):
        cpu = head["paths"][path]["cpu_ms_per_request"]
        assert cpu["picker"] > 0 and cpu["envoy"] > 0, path
    gateway = head["paths"]["gateway"]["cpu_ms_per_request"]
    assert gateway["gateway"] > 0 and gateway["envoy"] == 0
    assert head["direct"]["cpu_ms_per_request"]["envoy"] > 0 and head["direct"]["rps"] > 0
    assert set(head["goals"]) == set(head["met"])
    assert all(isinstance(v, bool) for v in head["met"].values())


def test_profile_summary_sorts_busy_samples_and_leaves_out_waiting(tmp_path: Path) -> None:
    """py-spy's raw format: ``frame;frame;...;leaf count``, outermost (the thread) first."""
    main = "thread (7): MainThread;run_forever (loop.c:1)"
    raw = tmp_path / "samples.raw"
    raw.write_text(
        f"{main};0x1 (grpc/_cython/cygrpc.so);sendmsg (libc.so.6) 40\n"
        f"{main};0x1 (grpc/_cython/cygrpc.so) 20\n"
        f"{main};_pick (regions/picker/pick.py:126);Py_DECREF (object.h:537) 20\n"
        f"{main};routed (regions/picker/extproc.py:91) 10\n"
        f"{main};PyUpb_Message_GetAttr (_message.abi3.so) 10\n"
        f"{main};epoll_pwait (libc.so.6) 500\n"
        "thread (8): Thread-1 (_poll_wrapper);epoll_wait (libc.so.6) 500\n"
    )
    got = epp_profile.summary(str(raw))
    assert got["busy_samples"] == 100
    assert got["share"] == {
        "syscall_sendmsg": 0.4,
        "grpc": 0.2,
        "decision": 0.2,
        "picker_messages": 0.1,
        "protobuf": 0.1,
    }
    assert got["threads"] == {"MainThread": 1.0}
