"""Topology validation: bad files fail at load with the field and the fix named."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from controlplane.__main__ import main as controlplane_main
from controlplane.kernel.config import ConfigError, load_topology, parse_topology

REPO = Path(__file__).resolve().parents[2]
GOOD = yaml.safe_load((REPO / "examples/topology.yaml").read_text())


def bad(mutate: dict[str, object]) -> str:
    data = {**GOOD, **mutate}
    with pytest.raises(ConfigError) as e:
        parse_topology(data, "t.yaml")
    return str(e.value)


def test_example_topology_loads() -> None:
    t = load_topology(REPO / "examples/topology.yaml")
    assert t.names == ("us-east", "us-west", "us-central", "eu-west")
    assert t.recovery.steps == 10


def test_lease_invariant_names_fields_and_fix() -> None:
    msg = bad({"timing": {"loop_period_s": 2, "retry_timeout_s": 5, "lease_ttl_s": 10}})
    assert "timing" in msg and "lease_ttl_s" in msg and "raise lease_ttl_s" in msg


def test_region_errors_name_the_region_field() -> None:
    regions = [dict(r) for r in GOOD["regions"]]
    regions[1]["zone"] = ""
    regions[2]["capacity_rps"] = -1
    msg = bad({"regions": regions})
    assert "regions[1].zone" in msg and "regions[2].capacity_rps" in msg


def test_references_and_duplicates() -> None:
    regions = [dict(r) for r in GOOD["regions"]]
    regions[0]["failover_to"] = ["mars"]
    assert "unknown regions ['mars']" in bad({"regions": regions})
    regions = [dict(r) for r in GOOD["regions"]] + [dict(GOOD["regions"][0])]
    assert "repeated" in bad({"regions": regions})
    assert "extra" in bad({"colour": "blue"}).lower() or "colour" in bad({"colour": "blue"})
    assert "report_stale_s" in bad({"timing": {"report_stale_s": 1, "probe_interval_s": 1}})


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_topology(tmp_path / "missing.yaml")
    p = tmp_path / "bad.yaml"
    p.write_text("regions: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_topology(p)


def test_cli_check_exits_2_with_the_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "t.yaml"
    p.write_text(yaml.safe_dump({**GOOD, "timing": {"lease_ttl_s": 1}}))
    assert controlplane_main(["--topology", str(p), "--check"]) == 2
    assert "timing.lease_ttl_s" in capsys.readouterr().err
    assert controlplane_main(["--topology", str(REPO / "examples/topology.yaml"), "--check"]) == 0
    assert "us-east" in capsys.readouterr().out


def test_routing_chars_default_is_the_gateways_default() -> None:
    # A topology without prefixes.routing_chars must route and pre-warm as a gateway or
    # an agent does when told nothing (an old leader's request carries 0: the default).
    from controlplane.kernel.config import PrefixesConfig
    from regions.dataplane.ring import DEFAULT_PREFIX_CHARS

    assert PrefixesConfig().routing_chars == DEFAULT_PREFIX_CHARS
