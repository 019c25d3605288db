"""failoverctl end to end: the installed CLI as a subprocess against a real control-plane
replica (in-process, real gRPC server, real etcd): output, --json, exit codes, refusals."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path

import pytest
from tectonic_api.v1 import controlplane_pb2 as pb

from chaos.lab.procs import until as poll
from controlplane.kernel.config import Topology
from regions.pool.processes import free_port
from tests.integration.cp_harness import (
    Running,
    fast_topology,
    region,
    reporting,
    running_replica,
    until,
)

pytestmark = pytest.mark.etcd
CLI = str(Path(sys.executable).with_name("failoverctl"))


async def ctl(
    server: str, *args: str, stdin: bytes = b"", timeout_s: float = 60.0
) -> tuple[int, str, str]:
    env = {
        **os.environ,
        "TECTONIC_SERVER": server,
        "TECTONIC_ACTOR": "oncall@test",
        "COLUMNS": "200",
        "NO_COLOR": "1",
    }
    proc = await asyncio.create_subprocess_exec(
        CLI,
        *args,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin), timeout_s)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.fixture
def topology(etcd: object) -> Topology:
    return fast_topology(etcd.endpoints, f"c{uuid.uuid4().hex[:8]}")  # type: ignore[attr-defined]


async def healthy(run: Running) -> None:
    await until(
        lambda s: s.responder_is_leader and all(r.health == pb.HEALTHY for r in s.regions),
        run.stub,
        {},
    )


async def test_status_history_and_json(topology: Topology) -> None:
    async with running_replica(topology) as run:
        await healthy(run)
        code, out, _ = await ctl(run.target, "status", "--json")
        assert code == 0
        data = json.loads(out)
        assert data["leader"] == "cp-a" and [r["name"] for r in data["regions"]] == [
            "east",
            "west",
            "central",
            "eu",
        ]
        assert {r["state"] for r in data["regions"]} == {"NORMAL"}
        code, out, _ = await ctl(run.target, "status")
        assert code == 0 and "east" in out and "NORMAL" in out and "leader cp-a" in out
        async with reporting(run.stub, {}):
            await asyncio.sleep(0.3)
            code, out, _ = await ctl(run.target, "regions")
        assert code == 0 and "agent:east=HEALTHY" in out


async def test_failover_refusals_confirmation_and_success(topology: Topology) -> None:
    async with running_replica(topology) as run, reporting(run.stub, {}):
        await healthy(run)
        t = run.target
        code, out, err = await ctl(t, "failover", "mars", "--reason", "x", "--yes")
        assert code == 2 and "unknown region" in err
        code, out, err = await ctl(t, "failover", "east", "--to", "eu", "--reason", "x", "--yes")
        assert code == 1 and "zone" in err
        code, out, err = await ctl(t, "failover", "east")
        assert code == 2 and "--reason" in err  # required option
        code, out, err = await ctl(t, "recover", "east", "--reason", "x", "--yes")
        assert code == 1 and "only a FAILING_OVER region" in err

        code, out, _ = await ctl(t, "failover", "east", "--reason", "plan", "--dry-run", "--json")
        assert code == 0 and set(json.loads(out)["plan"]["targets"]) == {"west", "central"}
        # No terminal to confirm on and no --yes: refuse, change nothing.
        code, out, err = await ctl(t, "failover", "east", "--reason", "INC-1")
        assert code == 4 and "--yes" in err
        st = await run.stub.GetStatus(pb.GetStatusRequest())
        assert region(st, "east").state == pb.NORMAL

        code, out, err = await ctl(
            t, "failover", "east", "--to", "west", "--reason", "INC-1 drain", "--yes"
        )
        assert code == 0, err
        assert "accepted: intent" in err and "traffic now goes to west 100%" in err
        code, out, _ = await ctl(t, "history", "--region", "east", "--json")
        events = json.loads(out)
        assert any(
            e["action"] == "transition"
            and e["actor"] == "oncall@test"
            and e["reason"] == "INC-1 drain"
            for e in events
        )


async def test_pause_resume_and_events_follow(topology: Topology) -> None:
    async with running_replica(topology) as run:
        await healthy(run)
        t = run.target
        env = {**os.environ, "TECTONIC_SERVER": t, "NO_COLOR": "1"}
        follower = await asyncio.create_subprocess_exec(
            CLI,
            "events",
            "--follow",
            "--replay",
            "0",
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        await asyncio.sleep(1.5)  # let it subscribe
        for bad in ("0", "-5m", "2 weeks", "8d"):  # bad input: exit 2, nothing paused
            code, _, err = await ctl(t, "pause", "--reason", "x", "--for", bad)
            assert code == 2 and ("duration" in err or "7 days" in err), (bad, err)
        assert not (await run.stub.GetStatus(pb.GetStatusRequest())).paused
        before = time.time()
        code, _, err = await ctl(t, "pause", "--reason", "etcd maintenance", "--for", "2h")
        assert code == 0 and "paused for 2h" in err
        st = await run.stub.GetStatus(pb.GetStatusRequest())
        assert st.paused and st.pause_reason == "etcd maintenance"
        assert before + 7200 <= st.paused_until <= time.time() + 7200
        code, out, _ = await ctl(t, "status")
        assert code == 0 and "AUTOMATION PAUSED" in out and "until" in out
        assert follower.stdout is not None
        line = await asyncio.wait_for(follower.stdout.readline(), 20)
        assert b"pause" in line and b"etcd maintenance" in line
        follower.kill()
        await follower.wait()
        code, _, err = await ctl(t, "resume")  # every change says why
        assert code == 2 and "--reason" in err
        code, _, _ = await ctl(t, "resume", "--reason", "done")
        assert code == 0
        assert not (await run.stub.GetStatus(pb.GetStatusRequest())).paused


async def test_hold_one_region_status_shows_it_and_it_ends_by_itself(topology: Topology) -> None:
    async with running_replica(topology) as run:
        await healthy(run)
        t = run.target
        code, _, err = await ctl(t, "hold", "mars", "--reason", "x")
        assert code == 2 and "unknown region mars" in err
        code, _, err = await ctl(t, "hold", "east", "--reason", "x", "--for", "8d")
        assert code == 2 and "7 days" in err  # the server's bound, nothing held
        code, _, err = await ctl(t, "hold", "east", "--for", "1h")
        assert code == 2 and "--reason" in err
        assert not region(await run.stub.GetStatus(pb.GetStatusRequest()), "east").HasField("hold")
        code, out, _ = await ctl(t, "hold", "east", "--reason", "INC-4 keep it", "--json")
        assert code == 0 and json.loads(out)["held"] is True
        st = await run.stub.GetStatus(pb.GetStatusRequest())
        east = region(st, "east")
        assert east.hold.reason == "INC-4 keep it" and east.hold.actor == "oncall@test"
        assert not region(st, "west").HasField("hold") and not st.paused  # one region only
        code, out, _ = await ctl(t, "status")
        assert code == 0 and "held until" in out and "held: INC-4 keep it" in out
        code, _, err = await ctl(t, "release", "east", "--reason", "INC-4 closed")
        assert code == 0 and "east released" in err
        assert not region(await run.stub.GetStatus(pb.GetStatusRequest()), "east").HasField("hold")
        # a short hold: the leader releases it at its end, audited as its own release
        code, _, _ = await ctl(t, "hold", "west", "--reason", "brief", "--for", "2s")
        assert code == 0

        async def released() -> bool:
            code, out, _ = await ctl(t, "history", "--region", "west", "--json")
            events = json.loads(out) if code == 0 else []
            return any(e["action"] == "release" and e["actor"] == "cp-a" for e in events)

        await poll(released, within=30, every=0.5, what="the leader's release of the hold")
        assert not region(await run.stub.GetStatus(pb.GetStatusRequest()), "west").HasField("hold")


async def test_unreachable_control_plane_exits_3() -> None:
    code, _, err = await ctl(f"127.0.0.1:{free_port()}", "--timeout", "1", "status")
    assert code == 3 and "unreachable" in err


async def test_every_command_explains_itself_with_an_example() -> None:
    for cmd in (
        ["status"],
        ["regions"],
        ["history"],
        ["events"],
        ["failover"],
        ["recover"],
        ["pause"],
        ["resume"],
        ["hold"],
        ["release"],
        ["sessions", "get"],
        ["sessions", "pin"],
    ):
        code, out, _ = await ctl("127.0.0.1:1", *cmd, "--help")
        assert code == 0 and "Example" in out, cmd
