"""What every bench shares: percentiles, JSON lines out, goals and whether they were
met, argument checks, CPU time of processes, the topology file and the routing in
etcd, killing what was started, and ``main``'s
exit codes (0 done, 1 the bench failed, 2 no etcd binary, 130 interrupted)."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sys
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, NoReturn

import yaml

from chaos.lab.local_etcd import etcd_available
from chaos.lab.procs import Proc
from controlplane.kernel.codec import encode
from controlplane.kernel.config import parse_topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import Routing
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.settings import EtcdConfig

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


class BenchError(RuntimeError):
    """The deployment did not do what the bench needs; the message says what and where."""


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None if empty."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def goals_and_met(
    goals: DataclassInstance, figures: Mapping[str, float | None], *, at_least: Collection[str] = ()
) -> dict[str, object]:
    """The headline's ``goals`` (the ``goals`` dataclass as a dict) and ``met``: for each
    goal, whether the figure of the same name is within it: ``<=`` the goal, or ``>=``
    for the goals named in ``at_least``. A figure that is None (no rounds) is not met."""
    limits: dict[str, float] = asdict(goals)
    met = {}
    for name, goal in limits.items():
        value = figures[name]
        met[name] = value is not None and (value >= goal if name in at_least else value <= goal)
    return {"goals": limits, "met": met}


class Reporter:
    """Progress on stderr, one JSON object a line on stdout; both silent with ``quiet``
    (the headline is printed by ``main``, quiet or not)."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def progress(self, text: str) -> None:
        if not self.quiet:
            print(text, file=sys.stderr, flush=True)

    def line(self, obj: dict[str, object]) -> None:
        if not self.quiet:
            print(json.dumps(obj), flush=True)


def at_least(low: int, name: str) -> Callable[[str], int]:
    """An argparse ``type``: a whole number ``>= low``. ``name`` is what argparse calls
    the type when the text is not a number ("invalid <name> value: 'x'")."""

    def parse(text: str) -> int:
        n = int(text.replace(",", "").replace("_", ""))  # "1,000,000" reads as it looks
        if n < low:
            raise argparse.ArgumentTypeError(f"must be {low} or more, got {n}")
        return n

    parse.__name__ = name
    return parse


def cpu_seconds(pid: int | None = None) -> float:
    """CPU time (user + system) a process has used so far: this one's when ``pid`` is
    None, else read from ``/proc/<pid>/stat`` (the benches run on Linux)."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    # the fields after the command name, which is in parentheses and may hold spaces
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def write_topology(path: Path, data: dict[str, object]) -> Path:
    """Check the topology here (not in each child process that reads it), then write it."""
    parse_topology(data, "bench topology")
    path.write_text(yaml.safe_dump(data))
    return path


async def write_routing(endpoint: str, cluster: str, region: str) -> None:
    """``routing/<region>`` in etcd: all of the region's traffic stays home (what a
    gateway or picker reads before it serves)."""
    async with EtcdStore(EtcdConfig(endpoints=(endpoint,))) as store:
        await store.put(Keys(cluster).routing(region), encode(Routing(targets={region: 1.0})))


def kill_all(procs: Iterable[Proc]) -> None:
    """SIGKILL and reap every process; one that fails to die does not stop the rest."""
    for p in procs:
        with contextlib.suppress(Exception):
            p.kill()


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM cleans up like Ctrl-C does."""

    def handler(signum: int, frame: FrameType | None) -> NoReturn:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(
    bench: Callable[[], dict[str, object]],
    failures: tuple[type[Exception], ...],
    *,
    on_sigterm_too: bool = True,
) -> int:
    """Run ``bench`` and print its headline as the last JSON line; the exit code.

    ``failures`` are the errors that mean the bench failed (exit 1, the message on
    stderr). Ctrl-C (and SIGTERM, with ``on_sigterm_too``) exits 130 once the
    bench's own cleanup has run."""
    if not etcd_available():
        print("error: the etcd binary is not installed (scripts/setup.sh)", file=sys.stderr)
        return 2
    sigterm = terminate_as_interrupt() if on_sigterm_too else contextlib.nullcontext()
    try:
        with sigterm:
            result = bench()
    except KeyboardInterrupt:
        print("interrupted; every process was stopped", file=sys.stderr)
        return 130
    except failures as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result), flush=True)
    return 0


def add_pools_flag(p: argparse.ArgumentParser, what: str) -> None:
    """``--pools N``: model pools per region (docs/models.md), 1-16; ``what`` says what
    the bench does with them."""
    p.add_argument(
        "--pools",
        type=int,
        default=1,
        choices=range(1, 17),
        metavar="N",
        help=f"model pools per region, 1-16 (docs/models.md): {what} (default 1: regions "
        "without pools)",
    )
