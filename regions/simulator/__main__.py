"""``python -m regions.simulator --host 127.0.0.1 --port N --model tiny``.

Prints one line ``READY http://HOST:PORT`` on stdout once it accepts requests (so
``--port 0`` can be used); logs go to stderr. Stops cleanly on SIGTERM / SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Sequence

from regions.simulator.engine import EngineConfig
from regions.simulator.server import SimConfig, serve, spec_decode_stats


def json_object(text: str) -> dict[str, object]:
    """``--speculative-config '{"method": "ngram", ...}'``: a JSON object, like vLLM's."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from e
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m regions.simulator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--model", "--served-model-name", dest="model", default="tiny")
    p.add_argument("--block-size", type=int, default=16, help="16 like GPU vLLM, 128 like CPU")
    p.add_argument(
        "--num-gpu-blocks-override",
        "--num-blocks",
        dest="num_blocks",
        type=int,
        default=4096,
        help="KV-cache capacity in blocks (LRU eviction beyond)",
    )
    p.add_argument("--max-num-seqs", type=int, default=8, help="max running requests")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--prefill-tokens-per-s", type=float, default=20_000.0)
    p.add_argument("--decode-tokens-per-s", type=float, default=200.0)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="report usage.prompt_tokens_details.cached_tokens",
    )
    p.add_argument(
        "--dev-mode",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="serve /sleep, /wake_up, /is_sleeping, /reset_prefix_cache",
    )
    p.add_argument(
        "--speculative-config",
        type=json_object,
        default=None,
        metavar="JSON",
        help="vLLM's speculative decoding config (JSON object, e.g. "
        '\'{"method": "ngram", "num_speculative_tokens": 3}\'): '
        "faster decode and the vllm:spec_decode_* metrics",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--access-log", action="store_true")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    for name in ("block_size", "num_blocks", "max_num_seqs", "max_model_len"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be positive")
    if args.prefill_tokens_per_s <= 0 or args.decode_tokens_per_s <= 0:
        p.error("token rates must be positive")
    try:
        spec_decode_stats(args.speculative_config)
    except ValueError as e:
        p.error(f"--speculative-config: {e}")
    return args


def config_from_args(args: argparse.Namespace) -> SimConfig:
    engine = EngineConfig(
        model=args.model,
        block_size=args.block_size,
        num_blocks=args.num_blocks,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        prefill_tokens_per_s=args.prefill_tokens_per_s,
        decode_tokens_per_s=args.decode_tokens_per_s,
        enable_prefix_caching=args.enable_prefix_caching,
        seed=args.seed,
    )
    return SimConfig(
        engine=engine,
        dev_mode=args.dev_mode,
        prompt_tokens_details=args.enable_prompt_tokens_details,
        speculative_config=args.speculative_config,
    )


async def _run(args: argparse.Namespace) -> None:
    runner, sim, port = await serve(
        config_from_args(args), args.host, args.port, access_log=args.access_log
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    logging.getLogger("tectonic.simulator").info(
        "simulator %s on http://%s:%d (block size %d%s)",
        args.model,
        args.host,
        port,
        args.block_size,
        f", speculative config {json.dumps(args.speculative_config)}"
        if args.speculative_config
        else "",
    )
    print(f"READY http://{args.host}:{port}", flush=True)
    try:
        await stop.wait()
    finally:
        sim.faults.clear()  # let hung requests finish instead of holding shutdown
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    asyncio.run(_run(args))


if __name__ == "__main__":
    main()
