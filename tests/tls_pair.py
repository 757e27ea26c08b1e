"""Certificates for tests that speak TLS: a self-signed serving pair, or a CA with leaves it signs.

Every certificate here is an ECDSA P-256 one, valid from five minutes ago for a day; a server
certificate is valid for ``localhost`` and ``127.0.0.1`` unless other names are given.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

LOOPBACK = ("localhost", "127.0.0.1")


def _subject_alt_names(names: Iterable[str]) -> x509.SubjectAlternativeName:
    from cryptography import x509

    sans: list[x509.GeneralName] = []
    for name in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(sans)


def _certificate(
    common_name: str,
    key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None = None,
    server: bool | None = None,
    names: Iterable[str] = (),
) -> x509.Certificate:
    """A certificate for ``key`` signed by ``issuer`` (name, key), or by itself. ``server``: True adds the
    serverAuth key usage, False clientAuth, None none; ``names`` become its subject alternative names."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    issuer_name, signer = issuer if issuer is not None else (subject, key)
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server is not None:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    names = list(names)
    if names:
        builder = builder.add_extension(_subject_alt_names(names), critical=False)
    return builder.sign(signer, hashes.SHA256())


def _write(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey, cert_path: Path, key_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


def _new_key() -> ec.EllipticCurvePrivateKey:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def self_signed_pair(directory: Path, common_name: str = "kube-icl-extender") -> tuple[Path, Path]:
    """Write ``tls.crt`` and ``tls.key`` into ``directory``: a certificate that is its own CA (so a client can
    trust it as ``caData``/``cafile``), valid for ``localhost`` and ``127.0.0.1`` for a day."""
    key = _new_key()
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    _write(_certificate(common_name, key, ca=True, names=LOOPBACK), key, cert_path, key_path)
    return cert_path, key_path


def ca_and_leaves(
    directory: Path, prefix: str, leaves: dict[str, bool], names: Iterable[str] = LOOPBACK
) -> dict[str, tuple[Path, Path]]:
    """A CA (``{prefix}-ca.crt/.key``) and leaf certificates it signs: ``leaves`` maps a name to True for a
    server certificate (valid for ``names``) or False for a client certificate. Returns name ->
    (cert, key) paths, the CA under ``"ca"``."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    def paths(name: str) -> tuple[Path, Path]:
        return directory / f"{prefix}-{name}.crt", directory / f"{prefix}-{name}.key"

    ca_key = _new_key()
    ca_cn = f"{prefix} test CA"
    _write(_certificate(ca_cn, ca_key, ca=True), ca_key, *paths("ca"))
    issuer = (x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca_cn)]), ca_key)
    out = {"ca": paths("ca")}
    for name, server in leaves.items():
        key = _new_key()
        cert = _certificate(name, key, ca=False, issuer=issuer, server=server, names=names if server else ())
        _write(cert, key, *paths(name))
        out[name] = paths(name)
    return out
