"""``--replica-slots`` on the gateway's and the endpoint picker's command lines: one
count or counts per replica URL, refused with exit 2 when malformed, and what it sets
reaches the replica choice (the balancers of the data plane)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from controlplane.kernel.store.memory import MemoryStore
from regions.dataplane.core import DataPlaneCore
from regions.dataplane.options import DataPlaneOptions
from regions.gateway.__main__ import parse_args as gateway_args
from regions.picker.__main__ import parse_args as picker_args

TOPOLOGY = "examples/topology.yaml"
EAST = "http://127.0.0.1:8000"  # us-east's replica there
OTHER = "http://127.0.0.1:8009"
BASE = ["--topology", TOPOLOGY, "--region", "us-east"]


def _gateway(argv: Sequence[str]) -> DataPlaneOptions:
    return gateway_args([*BASE, *argv])[0]


def _picker(argv: Sequence[str]) -> DataPlaneOptions:
    return picker_args([*BASE, *argv])[0].routing


PARSERS: list[Callable[[Sequence[str]], DataPlaneOptions]] = [_gateway, _picker]


@pytest.mark.parametrize("parse", PARSERS)
@pytest.mark.parametrize(
    ("flags", "slots"),
    [
        ([], None),
        (["--replica-slots", "8"], 8),
        (
            ["--replica-slots", f"{EAST}=6,http://10.0.0.2:8000=12"],
            {EAST: 6, "http://10.0.0.2:8000": 12},
        ),
        (
            ["--replica-slots", f"{EAST}=6", "--replica-slots", "https://h:1=2"],
            {EAST: 6, "https://h:1": 2},
        ),
    ],
)
def test_the_flag_gives_one_count_or_counts_per_replica(
    parse: Callable[[Sequence[str]], DataPlaneOptions], flags: list[str], slots: Any
) -> None:
    assert parse(flags).replica_slots == slots


@pytest.mark.parametrize("parse", PARSERS)
@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("0", "at least 1, got '0'"),
        ("eight", "at least 1, got 'eight'"),
        ("8,9", "expected one number, or URL=N"),
        (f"{EAST}=0", f"--replica-slots {EAST}: expected a whole number of at least 1"),
        (f"{EAST}=", "at least 1, got ''"),
        ("10.0.0.1:8000=4", "URL as http://host:port"),
        (f"{EAST}=4,{EAST}=5", f"{EAST} given twice"),
    ],
)
def test_a_malformed_value_is_refused_naming_the_flag(
    parse: Callable[[Sequence[str]], DataPlaneOptions],
    value: str,
    says: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse(["--replica-slots", value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--replica-slots" in err and says in err


def test_help_explains_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        gateway_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--replica-slots N|URL=N[,URL=N...]" in out
    assert "one number for every replica, or URL=N per replica" in out


def test_the_flag_reaches_the_replica_choice(tmp_path: Path) -> None:
    """Slots given per URL bound the replica choice: a prefix's owner given one slot
    takes one request, the next of that prefix goes to the other replica; a count for
    all bounds every replica, and a region's replica not named is learned."""
    topology = tmp_path / "topology.yaml"
    two = f"replicas: [{EAST}, {OTHER}]"
    text = Path(TOPOLOGY).read_text().replace(f"replicas: [{EAST}]", two, 1)
    topology.write_text(text)
    argv = ["--topology", str(topology), "--region", "us-east", "--replica-slots"]
    core = DataPlaneCore(gateway_args([*argv, f"{EAST}=1"])[0], store=MemoryStore())
    east = core.balancers["us-east"]
    assert (east.slots(EAST), east.slots(OTHER)) == (1, None)
    key = next(k for k in range(0, 2**64, 2**54) if next(iter(east.ring.walk(k))) == EAST)
    assert east.choose(key) == EAST
    east.acquire(EAST)
    assert east.choose(key) == OTHER
    assert core.balancers["eu-west"].slots("http://127.0.0.1:8001") is None
    everywhere = DataPlaneCore(gateway_args([*argv, "5"])[0], store=MemoryStore())
    assert {b.slots(r) for b in everywhere.balancers.values() for r in b.replicas} == {5}


def test_slots_given_for_all_reach_a_replica_that_joins_later() -> None:
    """A pool change builds the balancer anew: the flag's count applies to its new
    replicas too, and a URL named for a replica not yet in rotation once it joins."""
    joiner = "http://10.9.9.9:8000"
    core = DataPlaneCore(_gateway(["--replica-slots", f"{EAST}=3,{joiner}=7"]), store=MemoryStore())
    rebuilt = core.balancers["us-east"].rebuilt([EAST, joiner])
    assert (rebuilt.slots(EAST), rebuilt.slots(joiner)) == (3, 7)
    core = DataPlaneCore(_gateway(["--replica-slots", "4"]), store=MemoryStore())
    rebuilt = core.balancers["us-east"].rebuilt([EAST, joiner])
    assert (rebuilt.slots(EAST), rebuilt.slots(joiner)) == (4, 4)
