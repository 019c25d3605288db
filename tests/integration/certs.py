"""Throwaway certificate authorities for TLS tests (the ``cryptography`` package).

``make_ca`` gives a CA; ``ca.issue(name, directory)`` a leaf certificate signed by it,
valid for 127.0.0.1 and localhost, usable as server and as client (both extended key
usages: each Tectonic process uses one identity both ways). Files are PEM.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID = datetime.timedelta(days=2)


@dataclass(frozen=True)
class Leaf:
    cert: Path
    key: Path


@dataclass(frozen=True)
class CertAuthority:
    name: str
    cert: Path  # the CA certificate: what peers put in their ``ca`` setting
    _key: ec.EllipticCurvePrivateKey
    _x509: x509.Certificate

    def issue(self, name: str, directory: Path) -> Leaf:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self._x509.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALID)
            .add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.DNSName("localhost"),
                        x509.IPAddress(ipaddress.IPv4Address("127.0.0.1")),
                    ]
                ),
                critical=False,
            )
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        leaf = Leaf(directory / f"{self.name}-{name}.pem", directory / f"{self.name}-{name}.key")
        leaf.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        leaf.key.write_bytes(_key_pem(key))
        leaf.key.chmod(0o600)
        return leaf


def make_ca(name: str, directory: Path) -> CertAuthority:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} test CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALID)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    path = directory / f"{name}-ca.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return CertAuthority(name, path, key, cert)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
