"""TLS material for the HTTP/3 front end: the configured certificate, or a development one made on first use.

QUIC has no plaintext mode, so a local demo needs a certificate. The development certificate is self-signed
for ``localhost``/127.0.0.1/::1, cached under the user cache directory (``$ELOQUENT_CACHE_DIR``, else
``$XDG_CACHE_HOME/eloquent-plugins``, else ``~/.cache/eloquent-plugins``). It is ECDSA P-256 and valid for
less than 14 days, because that is what browsers accept through WebTransport's ``serverCertificateHashes``
(no flags, no trust store): the page gets its SHA-256 from ``GET /eloquent/cert-hash``. It is renewed on its
own when under 2 days are left (an older RSA or long-lived one is replaced on first use). Python clients pass
``verify=False`` or ``verify=<cert path>``. Development only: production uses a real certificate.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from eloquent_plugins.core.errors import ConfigError

_VALIDITY = datetime.timedelta(days=13)
"""Whole validity period (not-before to not-after) of a development certificate: under the browsers' 14 days."""
_BACKDATE = datetime.timedelta(minutes=5)
"""Not-before this far back, for clocks slightly behind; counted inside ``_VALIDITY``."""
WEBTRANSPORT_MAX_VALIDITY = datetime.timedelta(days=14)
"""The longest validity a browser accepts for a ``serverCertificateHashes`` certificate (W3C WebTransport)."""
_RENEW_BEFORE = datetime.timedelta(days=2)


@dataclass(frozen=True, slots=True)
class CertificatePair:
    certfile: Path
    keyfile: Path


def cache_dir() -> Path:
    explicit = os.environ.get("ELOQUENT_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "eloquent-plugins"


def hash_eligible(cert: x509.Certificate, now: datetime.datetime | None = None) -> bool:
    """Whether browsers accept ``cert`` by hash (``serverCertificateHashes``): ECDSA P-256, valid now, and a
    validity period of at most 14 days."""
    now = now or datetime.datetime.now(datetime.UTC)
    key = cert.public_key()
    return (isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1)
            and cert.not_valid_before_utc <= now < cert.not_valid_after_utc
            and cert.not_valid_after_utc - cert.not_valid_before_utc <= WEBTRANSPORT_MAX_VALIDITY)


def _still_valid(certfile: Path, keyfile: Path) -> bool:
    """A cached development pair that is still usable: loads, is hash-eligible (so an old RSA or year-long
    one is replaced) and has more than ``_RENEW_BEFORE`` left."""
    try:
        cert = x509.load_pem_x509_certificate(certfile.read_bytes())
        serialization.load_pem_private_key(keyfile.read_bytes(), password=None)
    except (OSError, ValueError):
        return False
    now = datetime.datetime.now(datetime.UTC)
    return hash_eligible(cert, now) and cert.not_valid_after_utc - now > _RENEW_BEFORE


def renewal_due(pair: CertificatePair) -> bool:
    """The development pair must be regenerated (missing, unreadable, not hash-eligible, or expiring)."""
    return not _still_valid(pair.certfile, pair.keyfile)


def certificate_sha256(certfile: Path) -> tuple[bytes, bool]:
    """SHA-256 of the first certificate's DER in ``certfile``, and whether browsers accept it by hash."""
    cert = x509.load_pem_x509_certificate(certfile.read_bytes())
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).digest(), hash_eligible(cert)


def cert_hash_document(certfile: Path) -> dict[str, str] | None:
    """The ``/eloquent/cert-hash`` body (``{"algorithm": "sha-256", "value": <base64>}``) for ``certfile``, or
    None when browsers would not accept it by hash (a real certificate: the system's trust applies)."""
    digest, eligible = certificate_sha256(certfile)
    return {"algorithm": "sha-256", "value": base64.b64encode(digest).decode()} if eligible else None


def _atomic_write(path: Path, data: bytes, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fp:
            fp.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def generate_dev_certificate(directory: Path) -> CertificatePair:
    """Write a fresh self-signed ECDSA P-256 certificate (13 days) and key into ``directory`` (atomically, key
    0600)."""
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost"),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "eloquent-plugins development")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now - _BACKDATE + _VALIDITY)
        .add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("::1")),
        ]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pair = CertificatePair(directory / "dev-cert.pem", directory / "dev-key.pem")
    # Key first: a reader that sees the new certificate must find its key.
    _atomic_write(pair.keyfile, key.private_bytes(serialization.Encoding.PEM,
                                                  serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()), 0o600)
    _atomic_write(pair.certfile, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return pair


def dev_pair(directory: Path | None = None) -> CertificatePair:
    """Where the development certificate lives (it may not exist yet)."""
    directory = directory or cache_dir()
    return CertificatePair(directory / "dev-cert.pem", directory / "dev-key.pem")


def dev_certificate(directory: Path | None = None) -> CertificatePair:
    """The cached development certificate, generated on first use or when it is about to expire."""
    directory = directory or cache_dir()
    pair = dev_pair(directory)
    if _still_valid(pair.certfile, pair.keyfile):
        return pair
    try:
        return generate_dev_certificate(directory)
    except OSError as exc:
        raise ConfigError(f"cannot write a development certificate under {directory}: {exc}; "
                          "set ELOQUENT_CACHE_DIR or pass certfile/keyfile") from None


def configured_certificate(certfile: str | None) -> Path:
    """The certificate file a front end with this setting serves (the development one when none is set),
    without generating anything: what ``/eloquent/cert-hash`` reads."""
    return Path(certfile) if certfile is not None else dev_pair().certfile


def resolve_certificate(certfile: str | None, keyfile: str | None) -> CertificatePair:
    """The configured pair (both files must exist), or the development certificate when none is set."""
    if certfile is None and keyfile is None:
        return dev_certificate()
    if certfile is None:
        raise ConfigError("keyfile is set but certfile is not")
    cert = Path(certfile)
    key = Path(keyfile) if keyfile is not None else None
    for path in (cert, key):
        if path is not None and not path.is_file():
            raise ConfigError(f"TLS file not found: {path}")
    return CertificatePair(cert, key if key is not None else cert)
