"""The pieces of ``failoverctl dashboard`` (controlplane/cli/dashboard_cmd.py); end to
end against a real replica: tests/integration/test_failoverctl_dashboard.py."""

from __future__ import annotations

import pytest

from controlplane.cli.dashboard_cmd import forwarded, parse_listen, upstream_headers


def test_it_listens_on_loopback_only() -> None:
    assert parse_listen("127.0.0.1:8090") == ("127.0.0.1", 8090)
    assert parse_listen("[::1]:0") == ("::1", 0)
    assert parse_listen("localhost:9000") == ("localhost", 9000)
    for bad, why in (
        ("0.0.0.0:8090", "only a loopback address"),
        ("10.0.0.1:8090", "only a loopback address"),
        ("example.com:8090", "only a loopback address"),  # a name may resolve anywhere
        ("127.0.0.1", "give a loopback host:port"),
        ("127.0.0.1:99999", "0..65535"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_listen(bad)


def test_only_the_apis_reads_are_forwarded() -> None:
    for path in ("/", "/docs", "/openapi.json", "/metrics", "/v1/status", "/v1/events"):
        assert forwarded(path), path
    for path in ("/etc/passwd", "/v1", "/healthz", "/docsx"):
        assert not forwarded(path), path


def test_the_token_replaces_any_credential_the_browser_sent() -> None:
    given = {"Authorization": "Basic x", "Cookie": "a=b", "Accept": "text/html", "Host": "h"}
    sent = upstream_headers(given, "tok")
    assert sent == {"Cookie": "a=b", "Accept": "text/html", "Authorization": "Bearer tok"}
    assert "Authorization" not in upstream_headers(given, None)
