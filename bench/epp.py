"""``python -m bench epp``: what Tectonic's endpoint picker costs behind a real Envoy.

One run starts a real etcd (holding ``routing/`` of one region), two simulators with a
fast latency model (they answer in microseconds plus their HTTP handling), one endpoint
picker (``tectonic-epp``), one Envoy per path from the shipped ``deploy/envoy/envoy.yaml``
and Tectonic's Python gateway, all in front of the same two simulators. The paths:

* ``direct``: Envoy alone, round robin over the two servers (no ext_proc): the baseline;
* ``header``: Envoy + the picker, header-only (request body mode NONE): the session
  header alone decides;
* ``body``: Envoy + the picker, BUFFERED body (the shipped default: prefix-aware
  routing and prefix counting read the prompt);
* ``full_duplex``: Envoy + the picker, FULL_DUPLEX_STREAMED body (an extra figure, not
  in the headline: which body mode is cheaper);
* ``gateway``: Tectonic's Python gateway alone.

One load generator (on uvloop, with the gateway's own lean HTTP/1.1 client, as
``bench gateway``) sends the same chat completions to every path (a session header
from a pool of ``--sessions`` ids; every ``--stream-every``-th request streams), in
alternating blocks (the order flips every round, so drift hits every path alike), in
two phases:

* **latency**: one request at a time: first byte (the first body bytes) and the whole
  request; ``added_ms_*`` = a path's percentile minus Envoy direct's, same run;
* **throughput**: ``--concurrency`` requests in flight: requests per second, and CPU
  per request of each process (from ``/proc/<pid>/stat``: Envoy, picker, gateway,
  simulators, the load generator); ``throughput_ratio_*`` is the median over rounds of
  the path's rate over Envoy direct's in the same round.

Every process shares this machine's cores (``cores`` in the output): Envoy's two
workers, the picker, the simulators and the load generator compete for them, so a
throughput ratio measures the CPU per request of all of them together (Envoy's own
ext_proc client included) more than what a picker on its own cores would allow.
The picker's CPU is also split by thread (``picker_threads_cpu_ms_per_request``: the
asyncio loop vs gRPC's own threads). ``--profile-picker FILE`` samples the picker with
py-spy meanwhile (``bench/epp_profile.py``) and reports where its CPU goes.

Each request the picker should route is checked to have been routed by it: a request
that Envoy sent down the fail-open route (picker slow or failing) fails the bench.

The deployment is in ``bench/epp_deploy.py``, the load in ``bench/epp_load.py``, the
figures in ``bench/epp_figures.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import uvloop

from bench import epp_profile
from bench._common import BenchError, Reporter, at_least, main
from bench.epp_deploy import Deployed, deployment, routed_by_the_picker
from bench.epp_figures import headline, path_line
from bench.epp_load import Options, drive, phase
from chaos.lab.envoy import stats
from regions.gateway.upstream import UpstreamPool


@contextlib.contextmanager
def sampled(pid: int, out: str) -> Iterator[None]:
    """py-spy samples ``pid`` into ``out`` meanwhile (nothing when ``out`` is '')."""
    if not out:
        yield
        return
    sampler = epp_profile.start(pid, out)
    try:
        yield
    except BaseException:
        sampler.kill()
        sampler.wait()
        raise
    epp_profile.stop(sampler)


async def measure(deployed: Deployed, opts: Options, say: Reporter) -> dict[str, object]:
    pool = UpstreamPool(max_idle=4096)
    try:
        say.progress("warming up (pins, connections)")
        for url in deployed.urls.values():
            await drive(pool, url, opts, max(200, opts.sessions * 2), opts.concurrency)
        before = {path: stats(e.admin_url) for path, e in deployed.envoys.items()}
        with sampled(deployed.pids["picker"], opts.profile):
            say.progress("latency phase (one request at a time)")
            lat = await phase(pool, deployed, opts, 1, opts.requests, say)
            say.progress(f"throughput phase ({opts.concurrency} in flight)")
            thr = await phase(pool, deployed, opts, opts.concurrency, opts.throughput_requests, say)
    finally:
        pool.close()
    errors = sum(s.errors for s in (*lat.total.values(), *thr.total.values()))
    if errors:
        raise BenchError(f"{errors} requests failed; the figures would be meaningless")
    routed_by_the_picker(deployed, before)
    for path in deployed.urls:
        say.line(path_line(path, lat.total[path], thr.total[path], opts))
    return headline(opts, lat, thr)


# ---- running ----------------------------------------------------------------------------


def run_bench(opts: Options, say: Reporter) -> dict[str, object]:
    if opts.profile and epp_profile.py_spy() is None:
        raise BenchError("--profile-picker needs py-spy: pip install py-spy")
    say.progress("starting etcd and two fast simulators")
    with (
        tempfile.TemporaryDirectory(prefix="tectonic-bench-epp-") as tmp,
        deployment(Path(tmp), opts.full_duplex, say) as deployed,
    ):
        result = uvloop.run(measure(deployed, opts, say))
    if opts.profile:
        result["picker_profile"] = epp_profile.summary(opts.profile)
    return result


_positive = at_least(1, "_positive")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--requests",
        type=_positive,
        default=300,
        help="requests per block and path in the latency phase (default 300)",
    )
    p.add_argument(
        "--throughput-requests",
        type=_positive,
        default=1500,
        help="requests per block and path in the throughput phase (default 1500)",
    )
    p.add_argument(
        "--blocks", type=_positive, default=4, help="rounds of blocks per phase (default 4)"
    )
    p.add_argument(
        "--concurrency",
        type=_positive,
        default=8,
        help="requests in flight in the throughput phase (default 8: for 2 cores)",
    )
    p.add_argument("--sessions", type=_positive, default=64, help="session ids (default 64)")
    p.add_argument("--max-tokens", type=_positive, default=4, help="tokens per answer")
    p.add_argument(
        "--stream-every",
        type=at_least(0, "_count"),
        default=2,
        help="every n-th request streams (default 2: half; 0: none)",
    )
    p.add_argument(
        "--no-full-duplex",
        action="store_true",
        help="leave out the full-duplex body mode (an extra, not in the headline)",
    )
    p.add_argument(
        "--profile-picker",
        metavar="FILE",
        default="",
        help="sample the picker with py-spy (pip install py-spy) into FILE while measuring "
        "and add where its CPU went to the headline (py-spy slows the picker: the run's "
        "figures are then not comparable with others)",
    )
    p.add_argument("--quiet", action="store_true", help="print only the final JSON line")


def run(args: argparse.Namespace) -> int:
    opts = Options(
        requests=args.requests,
        throughput_requests=args.throughput_requests,
        blocks=args.blocks,
        concurrency=args.concurrency,
        sessions=args.sessions,
        max_tokens=args.max_tokens,
        stream_every=args.stream_every,
        full_duplex=not args.no_full_duplex,
        profile=str(Path(args.profile_picker).resolve()) if args.profile_picker else "",
        quiet=args.quiet,
    )
    return main(lambda: run_bench(opts, Reporter(opts.quiet)), (BenchError, RuntimeError))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m bench.epp",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
