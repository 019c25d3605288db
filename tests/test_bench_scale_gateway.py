"""``bench/scale_gateway.py``'s parts that need no gateway (the bench itself starts one
on a real etcd: ``python -m bench.scale_gateway 512``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench._common import write_topology
from bench.scale import _topology
from bench.scale_gateway import measure_gateway, rss_mb
from chaos.lab.local_etcd import EtcdServer


def test_rss_is_read_from_proc() -> None:
    assert rss_mb(os.getpid()) > 1.0


@pytest.mark.parametrize(("idle_s", "scrapes"), [(0.0, 1), (1.0, 0)])
async def test_bad_settings_are_refused_before_anything_starts(idle_s: float, scrapes: int) -> None:
    with pytest.raises(ValueError, match="idle_s must be positive and scrapes at least 1"):
        await measure_gateway(
            2, Path("/nonexistent.yaml"), "127.0.0.1:1", idle_s=idle_s, scrapes=scrapes
        )


@pytest.mark.etcd
async def test_a_small_gateway_is_measured_end_to_end(
    etcd: EtcdServer, cluster_name: str, tmp_path: Path
) -> None:
    # bench scale's topology at 4 regions, under a fresh cluster name
    data = {**_topology(4, etcd.endpoint, 9, 9), "cluster": cluster_name}
    path = write_topology(tmp_path / "topology.yaml", data)
    got = await measure_gateway(4, path, etcd.endpoint, idle_s=0.5, scrapes=1)
    assert set(got) >= {"gateway_load_ms_4", "gateway_rss_mb_4", "health_ms_during_scrape_4"}
    assert isinstance(got["gateway_load_ms_4"], int) and got["gateway_load_ms_4"] > 0
    assert isinstance(got["gateway_rss_mb_4"], float) and got["gateway_rss_mb_4"] > 10
    assert isinstance(got["metrics_samples_4"], int) and got["metrics_samples_4"] > 100
    assert isinstance(got["metrics_bytes_4"], int) and got["metrics_bytes_4"] > 0
