"""The security model, pure: token hashes, the role table against the protos, the
``security:`` section's validation, the rate limiter on a fake clock, the hash-token
tool, and how failoverctl words the refusals."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
import yaml
from externalscaler import externalscaler_pb2
from tectonic_api.v1 import agent_pb2, controlplane_pb2

from controlplane.cli.client import EXIT_BAD_INPUT, EXIT_REFUSED, _exit_code, _message
from controlplane.kernel.config import ConfigError, load_topology, parse_topology
from controlplane.kernel.rpc.auth import _bearer
from controlplane.kernel.security import (
    METHOD_PERMISSIONS,
    RATE_LIMITED,
    ROLE_PERMISSIONS,
    Permission,
    Principal,
    RateLimiter,
    Role,
    SecurityConfig,
    TokenEntry,
    TokenVerifier,
    hash_token,
    is_open,
    main,
    new_token,
    roles_with,
    verify_token,
)
from controlplane.kernel.store.settings import EtcdConfig

REPO = Path(__file__).resolve().parents[2]
GOOD = yaml.safe_load((REPO / "examples/topology.yaml").read_text())
N = 2**10  # cheap scrypt: these tests check the format, not the cost


def test_hash_round_trip_and_refusals() -> None:
    token = new_token()
    hashed = hash_token(token, n=N)
    assert hashed.startswith(f"scrypt${N}$8$1$") and token not in hashed
    assert verify_token(token, hashed)
    wrong_secret = token[:-1] + ("A" if token[-1] != "A" else "B")
    assert not verify_token(wrong_secret, hashed)
    assert not verify_token(new_token(), hashed)  # another selector
    assert not verify_token("Bearer " + token, hashed)
    assert hash_token(token, n=N) == hashed  # the salt is the token's selector
    with pytest.raises(ValueError, match="not a Tectonic token"):
        hash_token("password123")


def _services() -> list[tuple[str, str]]:
    out = []
    for module in (controlplane_pb2, agent_pb2, externalscaler_pb2):
        for svc in module.DESCRIPTOR.services_by_name.values():
            out += [(svc.full_name, m.name) for m in svc.methods]
    return out


def test_every_rpc_of_the_protos_has_a_permission() -> None:
    methods = {f"/{svc}/{name}" for svc, name in _services()}
    assert methods - set(METHOD_PERMISSIONS) == set(), "add them to METHOD_PERMISSIONS"
    assert set(METHOD_PERMISSIONS) - methods == set(), "stale entries in METHOD_PERMISSIONS"


def test_role_table() -> None:
    cp = "/tectonic.v1.ControlPlane/"
    assert METHOD_PERMISSIONS[cp + "RequestFailover"] is Permission.OPERATE
    assert METHOD_PERMISSIONS[cp + "RequestDrill"] is Permission.DRILL
    assert METHOD_PERMISSIONS[cp + "ReportHealth"] is Permission.REPORT
    assert roles_with(Permission.OPERATE) == [Role.OPERATOR, Role.ADMIN]
    assert roles_with(Permission.DRILL) == [Role.DRILL_RUNNER, Role.OPERATOR, Role.ADMIN]
    assert roles_with(Permission.REPORT) == [Role.REPORTER, Role.ADMIN]
    assert all(Permission.READ in perms for perms in ROLE_PERMISSIONS.values())
    assert ROLE_PERMISSIONS[Role.ADMIN] == frozenset(Permission)
    assert frozenset({Permission.DRILL, Permission.OPERATE}) == RATE_LIMITED
    assert is_open("/grpc.health.v1.Health/Check")
    assert is_open("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
    assert not is_open(cp + "GetStatus")
    assert not Principal("bob", Role.VIEWER).may(Permission.OPERATE)


def test_verifier_finds_by_selector_and_caches() -> None:
    tokens = {n: new_token() for n in ("alice", "bob")}
    v = TokenVerifier(
        [
            TokenEntry(name="alice", role=Role.OPERATOR, hash=hash_token(tokens["alice"], n=N)),
            TokenEntry(name="bob", role=Role.VIEWER, hash=hash_token(tokens["bob"], n=N)),
        ]
    )
    assert v.cached(tokens["alice"]) is None
    assert v.verify(tokens["alice"]) == Principal("alice", Role.OPERATOR)
    assert v.cached(tokens["alice"]) == Principal("alice", Role.OPERATOR)
    assert v.verify(tokens["bob"][:-2] + "xx") is None
    assert v.verify(new_token()) is None and v.verify("garbage") is None
    assert not TokenVerifier([])


def test_bearer_metadata() -> None:
    assert _bearer((("authorization", "Bearer abc"),)) == "abc"
    assert _bearer((("authorization", "bearer  abc "),)) == "abc"
    assert _bearer((("authorization", "Basic abc"),)) is None
    assert _bearer((("x-other", "Bearer abc"),)) is None
    assert _bearer(None) is None


def test_rate_limiter_on_a_fake_clock() -> None:
    t = [0.0]
    lim = RateLimiter(per_minute=6, burst=3, now=lambda: t[0])  # one every 10 s
    assert [lim.take("alice") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert lim.take("alice") == pytest.approx(10.0)
    assert lim.take("bob") == 0.0  # per principal
    t[0] = 4.0
    assert lim.take("alice") == pytest.approx(6.0)  # a refusal costs nothing
    t[0] = 10.0
    assert lim.take("alice") == 0.0
    assert lim.take("alice") == pytest.approx(10.0)
    t[0] = 1000.0  # refills up to the burst, no more
    assert [lim.take("alice") for _ in range(4)][-1] == pytest.approx(10.0)


def _with_security(section: object) -> str:
    with pytest.raises(ConfigError) as e:
        parse_topology({**GOOD, "security": section}, "t.yaml")
    return str(e.value)


def test_security_is_off_unless_configured() -> None:
    assert load_topology(REPO / "examples/topology.yaml").security is None
    t = parse_topology({**GOOD, "security": {}}, "t.yaml")
    assert t.security == SecurityConfig()
    assert t.security.limits.max_request_bytes == 64 * 1024


def test_security_section_errors_name_the_field() -> None:
    good = hash_token(new_token(), n=N)
    msg = _with_security({"tokens": [{"name": "a", "role": "operator", "hash": "sha1$x"}]})
    assert "security.tokens[0].hash" in msg and "hash-token" in msg
    msg = _with_security({"tokens": [{"name": "a", "role": "root", "hash": good}]})
    assert "security.tokens[0].role" in msg
    weak = good.replace(f"scrypt${N}$", "scrypt$16$")
    assert "out of range" in _with_security(
        {"tokens": [{"name": "a", "role": "admin", "hash": weak}]}
    )
    twice = [
        {"name": "a", "role": "admin", "hash": good},
        {"name": "b", "role": "admin", "hash": good},
    ]
    assert "listed twice" in _with_security({"tokens": twice})
    other = hash_token(new_token(), n=N)
    roles = [
        {"name": "a", "role": "admin", "hash": good},
        {"name": "a", "role": "viewer", "hash": other},
    ]
    assert "one principal has one role" in _with_security({"tokens": roles})
    assert "security.tls.key" in _with_security({"tls": {"ca": "ca.pem", "cert": "c.pem"}})
    msg = _with_security({"limits": {"max_request_bytes": 10, "mutating_burst": 0}})
    assert "security.limits.max_request_bytes" in msg and "security.limits.mutating_burst" in msg
    assert "security.tokenz" in _with_security({"tokenz": []})
    # Rotation: one name may hold two tokens of the same role.
    rotated = [
        {"name": "a", "role": "admin", "hash": good},
        {"name": "a", "role": "admin", "hash": other},
    ]
    parse_topology({**GOOD, "security": {"tokens": rotated}}, "t.yaml")


def test_etcd_tls_and_auth_settings() -> None:
    with pytest.raises(ValueError, match="cert and key go together"):
        EtcdConfig(ca="ca.pem", cert="c.pem")
    with pytest.raises(ValueError, match="needs ca"):
        EtcdConfig(cert="c.pem", key="k.pem")
    with pytest.raises(ValueError, match="user and password_file"):
        EtcdConfig(user="root")
    cfg = EtcdConfig(ca="ca.pem", user="root", password_file="pw")
    assert cfg.tls and not EtcdConfig().tls


def test_hash_token_tool(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["hash-token", "--name", "alice", "--role", "drill-runner", "--scrypt-n", str(N)]) == 0
    )
    token, entry_line = capsys.readouterr().out.splitlines()
    [entry] = yaml.safe_load(entry_line)
    e = TokenEntry.model_validate(entry)
    assert e.name == "alice" and e.role is Role.DRILL_RUNNER and verify_token(token, e.hash)
    parse_topology({**GOOD, "security": {"tokens": [entry]}}, "t.yaml")
    assert main(["hash-token", "--name", "bad name", "--role", "viewer"]) == 2


def test_cli_words_refusals_with_what_to_do() -> None:
    denied = "your token's role is viewer (principal bob); RequestFailover needs operator or admin"
    msg = _message(grpc.StatusCode.PERMISSION_DENIED, denied)
    assert msg.startswith("permission denied: your token's role is viewer") and "Ask" in msg
    assert "--token" in _message(grpc.StatusCode.UNAUTHENTICATED, "no bearer token")
    rate = "rate limit: 4 commands at once, then 6 a minute per principal; retry in 9.0s"
    assert _exit_code(grpc.StatusCode.RESOURCE_EXHAUSTED, rate) == EXIT_REFUSED
    too_big = "Received message larger than max (8203 vs. 4096)"
    assert _exit_code(grpc.StatusCode.RESOURCE_EXHAUSTED, too_big) == EXIT_BAD_INPUT
    assert _exit_code(grpc.StatusCode.PERMISSION_DENIED, denied) == EXIT_REFUSED
    assert _exit_code(grpc.StatusCode.UNAUTHENTICATED, "x") == 5
