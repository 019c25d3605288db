"""Who may call what: the ``security:`` topology section, bearer tokens, roles, rate limits.

Pure: models, hashing, the role table and the token check; no gRPC, no files (the
adapters are ``controlplane/kernel/rpc/tls.py`` and ``controlplane/kernel/rpc/auth.py``).
Security is off unless the topology has a ``security:`` section (controlplane/SECURITY.md).

Tokens look like ``tct_<selector>_<secret>``: 32 hex characters, then 43 URL-safe
base64 characters (256 random bits). The configuration stores only
``scrypt$N$r$p$<salt>$<digest>``, where the salt is the token's selector: a server
finds the one entry a token can match by its selector and runs one scrypt for it,
instead of one per configured token (which would let any stranger with a made-up
token burn N scrypts per call). Successful checks are cached by the token's SHA-256,
so a client pays the scrypt once, not per call.

    python -m controlplane.kernel.security hash-token --name alice --role operator
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import re
import secrets
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Annotated, Self

from pydantic import Field, field_validator, model_validator

from controlplane.kernel.model import Frozen


class Role(StrEnum):
    VIEWER = "viewer"
    REPORTER = "reporter"  # agents and gateways: health reports
    DRILL_RUNNER = "drill-runner"
    OPERATOR = "operator"
    ADMIN = "admin"


class Permission(StrEnum):
    READ = "read"  # status, history, events, sessions, readiness, prefixes, drills
    REPORT = "report"  # ReportHealth: a vote in the failure quorum
    DRILL = "drill"  # ask the drill service for a drill
    OPERATE = "operate"  # anything that moves traffic or changes what automation does


ROLE_PERMISSIONS: Mapping[Role, frozenset[Permission]] = MappingProxyType(
    {
        Role.VIEWER: frozenset({Permission.READ}),
        # Reporting is not a subset of operating: a health report is a vote that can
        # fail a region over by quorum, so an operator token cannot fake one.
        Role.REPORTER: frozenset({Permission.READ, Permission.REPORT}),
        Role.DRILL_RUNNER: frozenset({Permission.READ, Permission.DRILL}),
        Role.OPERATOR: frozenset({Permission.READ, Permission.DRILL, Permission.OPERATE}),
        Role.ADMIN: frozenset(Permission),
    }
)

_CP = "/tectonic.v1.ControlPlane/"
_AGENT = "/tectonic.v1.RegionAgent/"
_KEDA = "/externalscaler.ExternalScaler/"
_KEDA_METHODS = ("IsActive", "StreamIsActive", "GetMetricSpec", "GetMetrics", "StreamMetricSpec")
# Every RPC of proto/tectonic_api/v1/*.proto; tests/unit/test_security.py fails when one
# is missing. A method missing here is refused (default deny), never let through.
METHOD_PERMISSIONS: Mapping[str, Permission] = MappingProxyType(
    {
        _CP + "GetStatus": Permission.READ,
        _CP + "WatchEvents": Permission.READ,
        _CP + "GetHistory": Permission.READ,
        _CP + "GetIntent": Permission.READ,
        _CP + "GetSession": Permission.READ,
        _CP + "GetReadiness": Permission.READ,
        _CP + "TopPrefixes": Permission.READ,
        _CP + "ListDrills": Permission.READ,
        _CP + "GetCapacity": Permission.READ,
        _CP + "GetScale": Permission.READ,
        _CP + "GetCost": Permission.READ,
        _CP + "ReportHealth": Permission.REPORT,
        _CP + "RequestDrill": Permission.DRILL,
        _CP + "RequestFailover": Permission.OPERATE,
        _CP + "RequestRecovery": Permission.OPERATE,
        _CP + "Pause": Permission.OPERATE,
        _CP + "Resume": Permission.OPERATE,
        _CP + "Hold": Permission.OPERATE,
        _CP + "Release": Permission.OPERATE,
        _CP + "LiftBudget": Permission.OPERATE,
        _CP + "UnliftBudget": Permission.OPERATE,
        _CP + "PinSession": Permission.OPERATE,
        _CP + "OverrideReadiness": Permission.OPERATE,
        # KEDA's external scaler (docs/keda.md): desired replicas, read-only
        **{_KEDA + m: Permission.READ for m in _KEDA_METHODS},
        _AGENT + "Describe": Permission.READ,
        # The leader's own token calls this on a failover target (role operator).
        _AGENT + "Prewarm": Permission.OPERATE,
    }
)
# Health checks (load balancers, the leader's probe) and reflection need no token.
OPEN_SERVICES = (
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
    "grpc.reflection.v1.ServerReflection",
)
# Commands are rate limited. Health reports are not: each observer sends one per probe
# interval and each overwrites its previous one (reports/<r>/<observer>).
RATE_LIMITED = frozenset({Permission.DRILL, Permission.OPERATE})


def is_open(method: str) -> bool:
    """True for ``/grpc.health.v1.Health/Check`` and the like: no token needed."""
    service = method.lstrip("/").split("/", 1)[0]
    return service in OPEN_SERVICES


def roles_with(permission: Permission) -> list[Role]:
    return [r for r in Role if permission in ROLE_PERMISSIONS[r]]


def method_name(method: str) -> str:
    """``RequestFailover`` for ``/tectonic.v1.ControlPlane/RequestFailover``."""
    return method.rsplit("/", 1)[-1]


# ---- tokens and their hashes ------------------------------------------------------------
TOKEN_RE = re.compile(r"^tct_(?P<selector>[0-9a-f]{32})_(?P<secret>[A-Za-z0-9_-]{43})$")
HASH_RE = re.compile(
    r"^scrypt\$(?P<n>\d+)\$(?P<r>\d+)\$(?P<p>\d+)\$(?P<salt>[0-9a-f]{32})\$(?P<digest>[0-9a-f]{64})$"
)
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1  # 16 MiB, 0.05-0.4 s: once per token, cached
MIN_N, MAX_N = 2**10, 2**17  # 2**10: fast enough for tests; 2**17 x r 8 = 128 MiB


def new_token() -> str:
    """A fresh random token (its selector is also the salt of its hash)."""
    return f"tct_{secrets.token_hex(16)}_{secrets.token_urlsafe(32)}"


def _scrypt(secret: str, salt_hex: str, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        secret.encode(),
        salt=bytes.fromhex(salt_hex),
        n=n,
        r=r,
        p=p,
        maxmem=132 * n * r + 128 * r * p + (1 << 20),  # what OpenSSL needs, plus slack
        dklen=32,
    )


def hash_token(token: str, n: int = SCRYPT_N, r: int = SCRYPT_R, p: int = SCRYPT_P) -> str:
    """The line to store in configuration: ``scrypt$N$r$p$<salt>$<digest>``."""
    m = TOKEN_RE.match(token)
    if m is None:
        raise ValueError("not a Tectonic token (tct_<32 hex>_<43 characters>)")
    digest = _scrypt(m["secret"], m["selector"], n, r, p)
    return f"scrypt${n}${r}${p}${m['selector']}${digest.hex()}"


def verify_token(token: str, hashed: str) -> bool:
    """Does ``token`` match the stored ``hashed`` line (constant-time comparison)?"""
    m, h = TOKEN_RE.match(token), HASH_RE.match(hashed)
    if m is None or h is None or m["selector"] != h["salt"]:
        return False
    digest = _scrypt(m["secret"], h["salt"], int(h["n"]), int(h["r"]), int(h["p"]))
    return hmac.compare_digest(digest, bytes.fromhex(h["digest"]))


# ---- the ``security:`` section ------------------------------------------------------------
class TlsConfig(Frozen):
    """One identity per process, used both ways: as a server it presents ``cert`` and
    checks client certificates against ``ca``; as a client it checks the server against
    ``ca`` and presents ``cert``. Paths are read at start (relative: to the working
    directory)."""

    ca: Annotated[str, Field(min_length=1, description="PEM CA bundle that signs every peer")]
    cert: Annotated[str, Field(min_length=1, description="this process's PEM certificate")]
    key: Annotated[str, Field(min_length=1, description="its PEM private key")]
    require_client_cert: Annotated[
        bool, Field(description="servers refuse clients without a certificate from ca (mTLS)")
    ] = True


class TokenEntry(Frozen):
    """A principal's bearer token, stored as its scrypt hash (controlplane/SECURITY.md,
    "Making a token")."""

    name: Annotated[
        str,
        Field(
            pattern=r"^[A-Za-z0-9][A-Za-z0-9._@:-]{0,63}$",
            description="the principal, as the audit log shows it; one name may hold two "
            "tokens (rotation) of one role",
        ),
    ]
    role: Annotated[Role, Field(description="what the token may do (controlplane/SECURITY.md)")]
    hash: Annotated[str, Field(description="scrypt$N$r$p$salt$digest (hash-token prints it)")]

    @field_validator("hash")
    @classmethod
    def _hash_format(cls, v: str) -> str:
        """hash is scrypt$N$r$p$salt$digest with N a power of two and r, p in range."""
        m = HASH_RE.match(v)
        if m is None:
            raise ValueError(
                "must look like scrypt$N$r$p$<32 hex salt>$<64 hex digest>; make one with "
                "`python -m controlplane.kernel.security hash-token --name NAME --role ROLE`"
            )
        n, r, p = int(m["n"]), int(m["r"]), int(m["p"])
        if n & (n - 1) or not MIN_N <= n <= MAX_N or not 1 <= r <= 16 or not 1 <= p <= 4:
            raise ValueError(
                f"scrypt parameters N={n} r={r} p={p} out of range: N a power of two in "
                f"[{MIN_N}, {MAX_N}], r in [1, 16], p in [1, 4]"
            )
        return v

    @property
    def selector(self) -> str:
        return self.hash.split("$")[4]


class LimitsConfig(Frozen):
    """Request size and command rate limits of the control plane's gRPC server."""

    max_request_bytes: Annotated[
        int, Field(ge=1024, le=16 * 1024 * 1024, description="larger requests: RESOURCE_EXHAUSTED")
    ] = 64 * 1024
    mutating_per_minute: Annotated[
        float, Field(gt=0, le=60_000, description="commands per principal, sustained")
    ] = 60.0
    mutating_burst: Annotated[int, Field(ge=1, le=10_000, description="commands at once")] = 20


class SecurityConfig(Frozen):
    """The ``security:`` section (controlplane/SECURITY.md); without it, security is off."""

    tls: Annotated[
        TlsConfig | None, Field(description="TLS on every gRPC link; unset: plaintext")
    ] = None
    # The principals every server of the deployment accepts. Empty: no token checks
    # (TLS only), and no role checks either.
    tokens: Annotated[
        tuple[TokenEntry, ...],
        Field(
            description="the principals every server accepts; empty: no token or role "
            "checks (TLS only)"
        ),
    ] = ()
    # This process's own token, for the calls it makes (agents and gateways: reporter;
    # the control plane, to agents: operator). The env TECTONIC_TOKEN wins over it.
    token_file: Annotated[
        str | None,
        Field(
            description="this process's own bearer token, for the calls it makes (agents "
            "and gateways: reporter; control planes: operator); TECTONIC_TOKEN wins over it"
        ),
    ] = None
    limits: Annotated[LimitsConfig, Field(description="request size and command rate limits")] = (
        LimitsConfig()
    )

    @model_validator(mode="after")
    def _unique(self) -> Self:
        """No token hash is listed twice, and one name has one role."""
        selectors = [t.selector for t in self.tokens]
        if len(set(selectors)) != len(selectors):
            raise ValueError("tokens: the same token hash is listed twice")
        roles: dict[str, Role] = {}
        for t in self.tokens:
            # One name may hold two tokens (rotation), never two roles.
            if roles.setdefault(t.name, t.role) is not t.role:
                raise ValueError(
                    f"tokens: {t.name!r} is listed with roles {roles[t.name]} and {t.role}; "
                    "one principal has one role"
                )
        return self


# ---- checks ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Principal:
    name: str
    role: Role

    def may(self, permission: Permission) -> bool:
        return permission in ROLE_PERMISSIONS[self.role]


class TokenVerifier:
    """Token → principal. ``cached`` is the fast path (no scrypt); ``verify`` runs the
    scrypt for the one entry the token's selector names and caches a success."""

    MAX_CACHED = 4096

    def __init__(self, tokens: Sequence[TokenEntry]) -> None:
        self._by_selector = {t.selector: t for t in tokens}
        self._cache: dict[bytes, Principal] = {}

    def __bool__(self) -> bool:
        return bool(self._by_selector)

    def cached(self, token: str) -> Principal | None:
        return self._cache.get(hashlib.sha256(token.encode()).digest())

    def verify(self, token: str) -> Principal | None:
        m = TOKEN_RE.match(token)
        entry = self._by_selector.get(m["selector"]) if m else None
        if entry is None or not verify_token(token, entry.hash):
            return None
        principal = Principal(entry.name, entry.role)
        if len(self._cache) >= self.MAX_CACHED:
            self._cache.clear()  # bounded; the next calls pay one scrypt again
        self._cache[hashlib.sha256(token.encode()).digest()] = principal
        return principal


class RateLimiter:
    """A token bucket per principal: ``burst`` calls at once, refilled at
    ``per_minute``. ``now`` is injected (monotonic seconds) so tests use a fake clock."""

    def __init__(self, per_minute: float, burst: int, now: Callable[[], float]) -> None:
        self.rate, self.burst, self._now = per_minute / 60.0, burst, now
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at)

    def take(self, key: str) -> float:
        """0.0 when the call may go ahead (and is counted); else the seconds until one
        would be allowed (nothing counted)."""
        now = self._now()
        tokens, at = self._buckets.get(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.rate)
        if tokens >= 1.0:
            self._buckets[key] = (tokens - 1.0, now)
            return 0.0
        self._buckets[key] = (tokens, now)
        return (1.0 - tokens) / self.rate


# ---- python -m controlplane.kernel.security hash-token -------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m controlplane.kernel.security",
        description="Make a bearer token for a Tectonic principal. Prints the token (line 1: "
        "hand it over, it is stored nowhere) and its entry for the topology's "
        "security.tokens list (line 2).",
    )
    sub = p.add_subparsers(dest="command", required=True)
    h = sub.add_parser("hash-token", help="print a new random token and its config entry")
    h.add_argument("--name", required=True, help="the principal, as the audit log shows it")
    h.add_argument("--role", required=True, choices=[r.value for r in Role])
    h.add_argument("--scrypt-n", type=int, default=SCRYPT_N, help=f"default {SCRYPT_N}")
    args = p.parse_args(argv)
    token = new_token()
    try:
        entry = TokenEntry(name=args.name, role=args.role, hash=hash_token(token, args.scrypt_n))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(token)
    print(f"- {{name: {entry.name}, role: {entry.role.value}, hash: '{entry.hash}'}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
