"""tectonic-epp's command line: options from flags and the topology, errors that name
the flag (exit 2, nothing started)."""

from __future__ import annotations

import pytest

from regions.picker.__main__ import parse_args
from regions.picker.extproc import BODY_FULL_DUPLEX

TOPOLOGY = "examples/topology.yaml"


def test_the_options_come_from_the_flags_and_the_topology() -> None:
    options, level = parse_args(
        [
            "--topology", TOPOLOGY, "--region", "us-east", "--listen", "127.0.0.1:9102",
            "--body-mode", "full-duplex", "--max-endpoints", "2", "--no-spill",
            "--session-header", "X-Conversation", "--control-plane", "127.0.0.1:7000",
        ]
    )  # fmt: skip
    assert (options.listen, options.body_mode, level.level) == (
        "127.0.0.1:9102",
        BODY_FULL_DUPLEX,
        "INFO",
    )
    assert options.picker is not None
    assert (options.picker.home, options.picker.max_endpoints, options.picker.spill) == (
        "us-east",
        2,
        False,
    )
    assert options.picker.zones["eu-west"] == "eu"
    assert options.routing.app.session_header == "x-conversation"
    assert options.routing.control_planes == ("127.0.0.1:7000",)
    assert options.routing.app.prefix_chars == options.routing.topology.prefixes.routing_chars
    assert options.max_message_timeout_s == 90.0  # deploy/envoy/envoy.yaml's


def test_a_longer_hold_needs_envoy_to_allow_it() -> None:
    base = ["--topology", TOPOLOGY, "--region", "us-east"]
    options, _ = parse_args([*base, "--wake-hold-max", "150", "--max-message-timeout", "155"])
    assert (options.routing.wake_hold_max_s, options.max_message_timeout_s) == (150.0, 155.0)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--region", "mars"], "--region 'mars' is not in the topology"),
        (["--region", "us-east", "--http-listen", "nowhere"], "expected host:port"),
        (["--region", "us-east", "--max-endpoints", "0"], "--max-endpoints must be positive"),
        (["--region", "us-east", "--body-mode", "streamed"], "invalid choice: 'streamed'"),
        (["--region", "us-east", "--observer-id", "-x"], "--observer-id"),
        # Envoy would fail a hold of 88 s open: it allows 90 s (deploy/envoy/envoy.yaml)
        (["--region", "us-east", "--wake-hold-max", "88"], "--max-message-timeout (90 s)"),
    ],
)
def test_bad_flags_are_refused_naming_the_flag(
    flags: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--topology", TOPOLOGY, *flags])
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err
