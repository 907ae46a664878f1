"""TLS material for the HTTP/3 front end: the configured certificate, or a development one made on first use.

QUIC has no plaintext mode, so a local demo needs a certificate. The development certificate is self-signed
for ``localhost``/127.0.0.1/::1, cached under the user cache directory (``$ELOQUENT_CACHE_DIR``, else
``$XDG_CACHE_HOME/eloquent-plugins``, else ``~/.cache/eloquent-plugins``) and renewed when near expiry.
Clients must pass ``verify=False`` or ``verify=<cert path>`` for it; never use it in production.
"""

from __future__ import annotations

import datetime
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

_VALIDITY = datetime.timedelta(days=365)
_RENEW_BEFORE = datetime.timedelta(days=7)


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


def _still_valid(certfile: Path, keyfile: Path) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(certfile.read_bytes())
        serialization.load_pem_private_key(keyfile.read_bytes(), password=None)
    except (OSError, ValueError):
        return False
    return cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC) > _RENEW_BEFORE


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
    """Write a fresh self-signed P-256 certificate and key into ``directory`` (atomically, key 0600)."""
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
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
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


def dev_certificate(directory: Path | None = None) -> CertificatePair:
    """The cached development certificate, generated on first use or when it is about to expire."""
    directory = directory or cache_dir()
    pair = CertificatePair(directory / "dev-cert.pem", directory / "dev-key.pem")
    if _still_valid(pair.certfile, pair.keyfile):
        return pair
    try:
        return generate_dev_certificate(directory)
    except OSError as exc:
        raise ConfigError(f"cannot write a development certificate under {directory}: {exc}; "
                          "set ELOQUENT_CACHE_DIR or pass certfile/keyfile") from None


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
