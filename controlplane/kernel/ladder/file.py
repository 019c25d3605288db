"""Loads ``runbooks/degradation.yaml`` and exports its JSON schema (docs/architecture.md §5).

Check a file (exit 0, or 2 with one line per problem):
``python -m controlplane.kernel.ladder.file check runbooks/degradation.yaml``; regenerate the
schema: ``python -m controlplane.kernel.ladder.file schema > runbooks/degradation.schema.json``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from controlplane.kernel.config import (
    ConfigError,
    RecoveryConfig,
    Topology,
    describe_errors,
    read_yaml,
)
from controlplane.kernel.ladder.model import ACTUATORS, Ladder

DEFAULT_PATH = Path(__file__).resolve().parents[3] / "runbooks" / "degradation.yaml"


def parse_ladder(data: object, source: str = "<ladder>") -> Ladder:
    try:
        return Ladder.model_validate(data)
    except ValidationError as e:
        # The actuator kinds are union tags that pydantic puts in the path; drop them.
        raise ConfigError(f"{source} is invalid:\n{describe_errors(e, ACTUATORS)}") from None


def load_ladder(path: str | Path = DEFAULT_PATH) -> Ladder:
    return parse_ladder(read_yaml(path, "ladder file"), str(path))


PACE = ("step_percent", "step_interval_s")


def topology_ladder(topology: Topology, topology_path: str | Path) -> Ladder | None:
    """The ladder ``topology`` names (relative to its file), None when it names none;
    ConfigError when the file cannot be used, or when both set the recovery pace."""
    if topology.degradation_ladder is None:
        return None
    path = Path(topology_path).parent / topology.degradation_ladder
    ladder = load_ladder(path)
    check_recovery_pace(topology, ladder, str(path))
    return ladder


def check_recovery_pace(topology: Topology, ladder: Ladder, source: str = "the ladder") -> None:
    """The recovery pace lives in one place: with a ladder file that has a ``recovery``
    section, the topology's ``recovery`` may not set another pace (one would win
    silently). Defaults, or the same values in both, are no conflict."""
    if "recovery" not in ladder.model_fields_set:
        return
    mine, default, file = topology.recovery, RecoveryConfig(), ladder.recovery
    if all(getattr(mine, f) == getattr(default, f) for f in PACE):
        return
    if all(getattr(mine, f) == getattr(file, f) for f in PACE):
        return
    raise ConfigError(
        f"recovery pace set twice: the topology's recovery section says "
        f"{mine.step_percent:g} % every {mine.step_interval_s:g}s, the degradation ladder "
        f"{source} says {file.step_percent:g} % every {file.step_interval_s:g}s (its "
        "recovery section); set recovery.step_percent and recovery.step_interval_s in one "
        "of them only (with a ladder, in the ladder file)"
    )


def recovery_config(ladder: Ladder, base: RecoveryConfig | None = None) -> RecoveryConfig:
    """The graduated traffic part of the file, in the shape the reconcile loop reads: its
    pace, and its guard with the baseline the first-token threshold is relative to. What
    the file does not say (the recovery pre-warm) is kept from ``base`` (the topology's)."""
    r, g = ladder.recovery, ladder.recovery.guard
    return (base or RecoveryConfig()).model_copy(
        update={
            "step_percent": r.step_percent,
            "step_interval_s": r.step_interval_s,
            "guard_ttft_p99_over_baseline": g.ttft_p99_over_baseline,
            "guard_error_rate_over": g.error_rate_over,
            "guard_auth_error_rate_over": g.auth_error_rate_over,
            "guard_headroom_under": g.headroom_under,
            "guard_queue_depth_over": g.queue_depth_over,
            "baseline_ttft_p99_s": ladder.baseline.ttft_p99_s,
            "baseline_per_region": dict(ladder.baseline.per_region),
        }
    )


def schema_text() -> str:
    """The committed ``runbooks/degradation.schema.json``, byte for byte."""
    schema = Ladder.model_json_schema()
    schema["title"] = "Tectonic degradation ladder (runbooks/degradation.yaml)"
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def describe(ladder: Ladder) -> str:
    lines = []
    for i, s in enumerate(ladder.steps, 1):
        lines.append(
            f"  {i}. {s.name}: {s.degrades} off via {s.actuator.kind} ({s.actuator.where}), "
            f"saves ~{s.saves.capacity_gain_percent:g} %"
        )
    r = ladder.recovery
    guard = ", ".join(f"{k} {v:g}" for k, v in r.guard.model_dump().items() if v is not None)
    lines.append(
        f"  recovery: {r.steps} steps of {r.step_percent:g} % every {r.step_interval_s:g}s "
        f"(~{r.duration_s:g}s), guard: {guard}; never degraded: "
        f"{', '.join(ladder.never_degraded)}"
    )
    return "\n".join(lines)


USAGE = "usage: python -m controlplane.kernel.ladder.file {schema | check [FILE]}"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["schema"] and len(args) == 1:
        sys.stdout.write(schema_text())
        return 0
    if args[:1] == ["check"] and len(args) <= 2:
        path = Path(args[1]) if len(args) == 2 else DEFAULT_PATH
        try:
            ladder = load_ladder(path)
        except ConfigError as e:
            print(e, file=sys.stderr)
            return 2
        print(f"{path}: ok, {len(ladder.steps)} steps in this order:\n{describe(ladder)}")
        return 0
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
