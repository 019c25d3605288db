"""How to reach etcd and look after its history: the store's own settings.

They live beside the store, not in the topology module, so that the store depends on
nothing above it; the topology (``controlplane/kernel/config.py``) holds one of them
under ``etcd:``.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from controlplane.kernel.model import Frozen

HOST_PORT = r"^[A-Za-z0-9.\-\[\]:]+:\d{1,5}$"


class EtcdConfig(Frozen):
    """How every process reaches etcd, and how the leader compacts its history
    (docs/etcd.md). Besides the topology's readers, the agent reads this section from
    its ``--security`` file (the endpoints are its ``--etcd``) and the drill service from
    its ``--topology`` (``--etcd`` overrides the endpoints)."""

    endpoints: Annotated[
        tuple[str, ...],
        Field(min_length=1, description="host:port of each member; calls fail over between them"),
    ] = ("127.0.0.1:2379",)
    request_timeout_s: Annotated[
        float, Field(gt=0, description="timeout of one call; its retries stop after twice this")
    ] = 2.0
    # Which member a call goes to. Spread, calls to members in other regions pay their
    # round trip on top of etcd's own (docs/etcd.md, "etcd across regions").
    balance: Annotated[
        Literal["round_robin", "first"],
        Field(
            description="round_robin: calls spread over every endpoint; first: the first "
            "endpoint that answers, the next only when it fails (an etcd across regions: "
            "list this process's own region's member first, e.g. with --etcd)"
        ),
    ] = "round_robin"
    # TLS to etcd (its --trusted-ca-file, and with --client-cert-auth our cert and key);
    # server_name: the name etcd's certificates carry, when endpoints are addresses.
    ca: Annotated[
        str | None, Field(description="CA bundle (PEM) that signs etcd's certificates: TLS to etcd")
    ] = None
    cert: Annotated[
        str | None,
        Field(description="client certificate (PEM), for etcd's --client-cert-auth; needs ca"),
    ] = None
    key: Annotated[str | None, Field(description="the client certificate's key (PEM)")] = None
    server_name: Annotated[
        str | None,
        Field(
            description="the name etcd's certificates carry, when the endpoints are "
            "addresses (default: the first endpoint's host)"
        ),
    ] = None
    # etcd's own users (etcdctl auth enable); the password is read from a file so that
    # the topology file, often in git, holds no secret.
    user: Annotated[
        str | None, Field(description="etcd user (etcdctl auth enable); needs password_file")
    ] = None
    password_file: Annotated[
        str | None,
        Field(description="file holding the user's password, so the topology holds no secret"),
    ] = None
    # The leader compacts etcd's history to the revision it had this long ago, every
    # compact_interval_s (docs/etcd.md); 0: never (then etcd's own
    # --auto-compaction-* must, or the store fills and refuses every write).
    compact_retention_s: Annotated[
        float,
        Field(
            ge=0,
            description="the leader compacts etcd's history to the revision it had this "
            "long ago; a watcher further behind relists. 0: never (then etcd's own "
            "--auto-compaction-* must, docs/etcd.md)",
        ),
    ] = 300.0
    compact_interval_s: Annotated[
        float, Field(gt=0, description="how often the leader compacts")
    ] = 60.0

    @model_validator(mode="after")
    def _endpoints(self) -> Self:
        """Endpoints are host:port; cert and key go together and need ca; user and
        password_file go together."""
        bad = [e for e in self.endpoints if not re.match(HOST_PORT, e)]
        if bad:
            raise ValueError(f"endpoints must be host:port, got {bad}")
        if (self.cert is None) != (self.key is None):
            raise ValueError("cert and key go together (etcd's client certificate)")
        if self.cert is not None and self.ca is None:
            raise ValueError("a client certificate needs ca (TLS to etcd)")
        if (self.user is None) != (self.password_file is None):
            raise ValueError("user and password_file go together (etcd authentication)")
        return self

    @property
    def tls(self) -> bool:
        return self.ca is not None
