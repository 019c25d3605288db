"""``--payload-keys DIR``: this zone's data keys for sealed replay payloads
(docs/residency.md), for the processes that seal (gateways, pickers) and open (agents)."""

from __future__ import annotations

import argparse

from controlplane.kernel.prefix.sealing import Keyring, KeyringError


def add_payload_keys_flag(p: argparse.ArgumentParser | argparse._ArgumentGroup, what: str) -> None:
    p.add_argument(
        "--payload-keys",
        metavar="DIR",
        default=None,
        help=f"this residency zone's data keys for replay payloads (docs/residency.md): a "
        f"directory of files named by key id, each the base64 of 32 random bytes, and "
        f"'active' naming the one that seals; {what}. Mount it only in the zone's clusters",
    )


def payload_keys(p: argparse.ArgumentParser, args: argparse.Namespace, *, seal: bool) -> str | None:
    """The ``--payload-keys`` directory, checked now so that a mistake stops the
    process at start (it is read again on every use); ``seal``: it must name an active
    key. A usage error names the flag and what to fix."""
    where: str | None = args.payload_keys
    if where is None:
        return None
    try:
        ring = Keyring.load(where)
    except (OSError, KeyringError) as e:
        p.error(f"--payload-keys: {e}")
    if not ring.keys:
        p.error(f"--payload-keys: {where} holds no key file")
    if seal and ring.active is None:
        p.error(f"--payload-keys: {where} has no 'active' file naming the key that seals")
    return where
