"""The ladder file's model and the pure executor, with a fake clock (docs/architecture.md §5)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from controlplane.core.ladder_executor import (
    ActionKind,
    LadderAction,
    LadderMode,
    mode_for,
    next_ladder_action,
)
from controlplane.kernel.config import ConfigError, parse_topology
from controlplane.kernel.ladder.file import (
    load_ladder,
    main,
    parse_ladder,
    recovery_config,
    schema_text,
)
from controlplane.kernel.ladder.model import Ladder, flags_for, with_headroom
from controlplane.kernel.ladder.record import DegradationRecord, FeatureFlags
from controlplane.kernel.model import RegionState
from controlplane.kernel.store.memory import MemoryStore
from controlplane.server import ControlPlaneReplica

REPO = Path(__file__).resolve().parents[2]
DEG, REC = LadderMode.DEGRADING, LadderMode.RECOVERING


def ladder_data() -> dict[str, Any]:
    """A small ladder independent of the committed file: one trigger signal per step."""

    def step(name: str, degrades: str, actuator: dict[str, Any], k: float) -> dict[str, Any]:
        saves = {"description": f"frees capacity ({name})", "capacity_gain_percent": 10}
        return {
            "name": name,
            "degrades": degrades,
            "actuator": actuator,
            "trigger": {"ttft_p99_over_baseline": k},
            "saves": saves,
        }

    return {
        "baseline": {"ttft_p99_s": 1.0, "per_region": {"slow": 2.0}},
        "degrade": {"step_interval_s": 10},
        "recovery": {
            "step_interval_s": 10,
            "step_percent": 10,
            "guard": {"ttft_p99_over_baseline": 1.5, "error_rate_over": 0.02},
        },
        "steps": [
            step("spec", "speculative_decoding", {"kind": "speculative_decoding_off"}, 2),
            step(
                "cap",
                "long_context",
                {"kind": "context_cap", "max_context_tokens": 16384, "mode": "truncate"},
                3,
            ),
            step("tools", "parallel_tool_calls", {"kind": "parallel_tool_calls_off"}, 4),
        ],
    }


LADDER = Ladder.model_validate(ladder_data())


def rejected(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as e:
        parse_ladder(data, "ladder.yaml")
    return str(e.value)


# -- validation --


def test_unknown_actuator_is_rejected_naming_the_field() -> None:
    d = ladder_data()
    d["steps"][1]["actuator"] = {"kind": "gpu_overclock"}
    msg = rejected(d)
    assert "steps[1].actuator: kind 'gpu_overclock' is not a known actuator" in msg
    assert "context_cap" in msg  # the fix: the known kinds


def test_degrading_basic_chat_is_rejected() -> None:
    d = ladder_data()
    d["steps"][0]["degrades"] = "basic_chat"
    assert "steps[0].degrades: 'basic_chat' is never degraded" in rejected(d)


def test_file_may_protect_more_but_not_less() -> None:
    d = ladder_data()
    d["never_degraded"] = ["basic_chat", "first_token_latency", "token_rate", "long_context"]
    assert "steps[1].degrades 'long_context' is in never_degraded" in rejected(d)
    d["never_degraded"] = ["basic_chat"]
    assert "never_degraded: must keep ['first_token_latency', 'token_rate']" in rejected(d)


def test_repeated_step_and_actuator_are_rejected() -> None:
    d = ladder_data()
    d["steps"].append(copy.deepcopy(d["steps"][0]))
    msg = rejected(d)
    assert "steps[3].name 'spec' repeats steps[0]" in msg
    assert "steps[3].actuator.kind 'speculative_decoding_off' repeats steps[0]" in msg


def test_empty_ladder_and_bad_thresholds_are_rejected() -> None:
    d = ladder_data()
    d["steps"] = []
    assert "steps: the ladder has no steps" in rejected(d)
    d = ladder_data()
    d["steps"][0]["trigger"] = {"error_rate_over": 1.5}
    assert "steps[0].trigger.error_rate_over: Input should be less than 1" in rejected(d)
    d["steps"][0]["trigger"] = {}
    assert "steps[0].trigger: no condition set" in rejected(d)
    d = ladder_data()
    d["steps"][1]["actuator"]["max_context_tokens"] = 10
    assert "steps[1].actuator.max_context_tokens: Input should be greater" in rejected(d)


def test_degrades_must_say_what_the_actuator_does() -> None:
    d = ladder_data()
    d["steps"][0]["degrades"] = "long_context"
    assert "write degrades: speculative_decoding" in rejected(d)


def test_committed_file_loads_and_schema_is_fresh() -> None:
    ladder = load_ladder(REPO / "runbooks" / "degradation.yaml")
    assert [s.actuator.kind for s in ladder.steps] == [
        "speculative_decoding_off",
        "context_cap",
        "parallel_tool_calls_off",
        "shed_low_priority",
    ]
    committed = (REPO / "runbooks" / "degradation.schema.json").read_text()
    assert committed == schema_text(), (
        "stale schema: run python -m controlplane.kernel.ladder.file schema "
        "> runbooks/degradation.schema.json and commit it"
    )
    assert recovery_config(ladder).steps == ladder.recovery.steps == 10


def test_cli_check_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(ladder_data()))
    assert main(["check", str(good)]) == 0
    assert "1. spec" in capsys.readouterr().out
    bad = ladder_data()
    bad["steps"][2]["degrades"] = "token_rate"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    assert main(["check", str(path)]) == 2
    assert "steps[2].degrades: 'token_rate' is never degraded" in capsys.readouterr().err
    assert main(["check", str(tmp_path / "missing.yaml")]) == 2
    assert main(["bogus"]) == 2


# -- flags --


def test_flags_for() -> None:
    assert flags_for(LADDER, []) == FeatureFlags()
    assert flags_for(LADDER, ["spec", "cap", "tools"]) == FeatureFlags(
        speculative_decoding=False,
        max_context_tokens=16384,
        context_cap_mode="truncate",
        parallel_tool_calls=False,
    )
    with pytest.raises(KeyError):
        flags_for(LADDER, ["nope"])


# -- executor, fake clock --


def tick(
    rec: DegradationRecord, mode: LadderMode, now: float, ttft: float, errors: float = 0.0
) -> LadderAction:
    signals = {"ttft_p99_s": ttft, "error_rate": errors}
    return next_ladder_action(LADDER, rec, signals, mode, now)


def test_applies_in_file_order_one_step_per_interval() -> None:
    rec = DegradationRecord(region="r")
    a = tick(rec, DEG, 0, ttft=9.0)  # every trigger fires: still only the first step
    assert (a.kind, a.step) == (ActionKind.APPLY, "spec")
    assert a.record.flags.speculative_decoding is False and a.record.epoch == 1
    held = tick(a.record, DEG, 9.9, ttft=9.0)
    assert held.kind is ActionKind.HOLD and "due in" in held.reason and held.record == a.record
    b = tick(a.record, DEG, 10, ttft=9.0)
    c = tick(b.record, DEG, 20, ttft=9.0)
    assert [b.step, c.step] == ["cap", "tools"]
    assert c.record.applied == ("spec", "cap", "tools")
    assert tick(c.record, DEG, 30, ttft=9.0).kind is ActionKind.NONE


def test_never_skips_ahead() -> None:
    # step 1 fires on TTFT only; step 2 also fires on errors, which step 1 ignores
    d = ladder_data()
    d["steps"][1]["trigger"]["error_rate_over"] = 0.01
    ladder = Ladder.model_validate(d)
    rec = DegradationRecord(region="r")
    a = next_ladder_action(ladder, rec, {"ttft_p99_s": 1.0, "error_rate": 0.05}, DEG, 0)
    assert a.kind is ActionKind.HOLD and a.record == rec
    assert "'cap' would fire" in a.reason and "never skips ahead" in a.reason
    quiet = next_ladder_action(ladder, rec, {"ttft_p99_s": 1.0}, DEG, 0)
    assert quiet.kind is ActionKind.NONE


def test_recovery_walks_backwards_one_step_per_interval() -> None:
    rec = DegradationRecord(region="r")
    for t in (0, 10, 20):
        rec = tick(rec, DEG, t, ttft=9.0).record
    restores = []
    for t in range(21, 80):
        a = tick(rec, REC, t, ttft=1.0)
        if a.changed:
            restores.append((t, a.kind, a.step))
        rec = a.record
    assert restores == [
        (30, ActionKind.RESTORE, "tools"),
        (40, ActionKind.RESTORE, "cap"),
        (50, ActionKind.RESTORE, "spec"),
    ]
    assert rec.applied == () and rec.flags == FeatureFlags()
    assert rec.restored == ("tools", "cap", "spec")


def test_restore_waits_while_its_trigger_fires() -> None:
    rec = tick(DegradationRecord(region="r"), DEG, 0, ttft=9.0).record
    # 2.2x baseline: spec's trigger (2x) still fires, the guard (1.5x) too: paused
    a = tick(rec, REC, 30, ttft=2.2)
    assert a.kind is ActionKind.HOLD and "guard" in a.reason
    d = ladder_data()
    d["recovery"]["guard"] = {"error_rate_over": 0.5}  # a guard that does not see TTFT
    ladder = Ladder.model_validate(d)
    b = next_ladder_action(ladder, rec, {"ttft_p99_s": 2.2}, REC, 30)
    assert b.kind is ActionKind.HOLD and "its trigger still fires" in b.reason


def test_guard_reapplies_the_last_restored_step_once() -> None:
    rec = DegradationRecord(region="r")
    for t in (0, 10):
        rec = tick(rec, DEG, t, ttft=9.0).record
    rec = tick(rec, REC, 20, ttft=1.0).record  # restores cap
    assert rec.applied == ("spec",) and rec.restored == ("cap",)
    spike = tick(rec, REC, 25, ttft=1.0, errors=0.05)
    assert (spike.kind, spike.step) == (ActionKind.REAPPLY, "cap")
    assert spike.record.applied == ("spec", "cap") and spike.record.restored == ()
    assert spike.record.flags.max_context_tokens == 16384
    still = tick(spike.record, REC, 26, ttft=1.0, errors=0.05)
    assert still.kind is ActionKind.HOLD and "paused by the guard" in still.reason
    # calm again: recovery resumes, paced from the re-apply
    assert tick(spike.record, REC, 34, ttft=1.0).kind is ActionKind.HOLD
    assert tick(spike.record, REC, 35, ttft=1.0).step == "cap"


def test_guard_covers_the_last_restore_then_retires() -> None:
    rec = tick(DegradationRecord(region="r"), DEG, 0, ttft=9.0).record
    rec = tick(rec, REC, 10, ttft=1.0).record  # restores spec: nothing applied now
    assert tick(rec, REC, 15, ttft=1.6).step == "spec"  # within one interval: re-applied
    later = tick(rec, REC, 25, ttft=1.6)  # a spike long after recovery is not its business
    assert later.kind is ActionKind.NONE


def test_headroom_per_region_baseline_frozen_and_unknown_steps() -> None:
    d = ladder_data()
    d["steps"][0]["trigger"] = {"headroom_under": 0.1}
    ladder = Ladder.model_validate(d)
    rec = DegradationRecord(region="r")
    signals = with_headroom({"load_rps": 95.0}, capacity_rps=100.0)
    assert next_ladder_action(ladder, rec, signals, DEG, 0).step == "spec"
    assert next_ladder_action(ladder, rec, {"load_rps": 95.0}, DEG, 0).kind is ActionKind.NONE
    # 3 s is 3x the file's baseline but 1.5x the slow region's own
    slow = DegradationRecord(region="slow")
    assert tick(slow, DEG, 0, ttft=3.0).kind is ActionKind.NONE
    assert tick(rec, DEG, 0, ttft=3.0).step == "spec"
    assert tick(rec, LadderMode.FROZEN, 0, ttft=9.0).kind is ActionKind.NONE
    odd = DegradationRecord(region="r", applied=("gone",), epoch=3)
    a = tick(odd, REC, 100, ttft=1.0)
    assert a.kind is ActionKind.HOLD and "not in the ladder file" in a.reason


def test_mode_for() -> None:
    assert mode_for(RegionState.DEGRADED) is DEG
    assert mode_for(RegionState.NORMAL, short_of_headroom=True) is DEG
    assert mode_for(RegionState.NORMAL) is REC
    assert mode_for(RegionState.RECOVERED) is REC
    assert mode_for(RegionState.FAILING_OVER, short_of_headroom=True) is LadderMode.FROZEN


async def test_a_replica_with_a_ladder_recovers_at_the_files_pace() -> None:
    topo = parse_topology(
        {
            "regions": [{"name": "a", "zone": "z", "agent": "127.0.0.1:1", "capacity_rps": 1}],
            "recovery": {"step_percent": 50, "step_interval_s": 1},
        }
    )
    ladder = load_ladder()
    replica = ControlPlaneReplica(topology=topo, store=MemoryStore(), replica_id="t", ladder=ladder)
    assert replica.topology.recovery == recovery_config(ladder) != topo.recovery
    plain = ControlPlaneReplica(topology=topo, store=MemoryStore(), replica_id="t")
    assert plain.topology.recovery == topo.recovery
