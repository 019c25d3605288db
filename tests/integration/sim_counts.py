"""What a simulator says it served, read from its own ``/metrics``."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from chaos.lab.procs import Proc


def served_count(sim: Proc) -> int:
    """Requests the simulator finished (vLLM's ``request_success`` counter)."""
    with urllib.request.urlopen(f"{sim.url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(
        int(sample.value)
        for family in text_string_to_metric_families(text)
        if family.name == "vllm:request_success"
        for sample in family.samples
        if sample.name.endswith("_total")
    )
