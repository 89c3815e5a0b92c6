"""A self-signed serving certificate for ``/metrics``, made at start when none is mounted.

``/metrics`` takes bearer tokens, which must not cross the network in clear, so it is served
over HTTPS. As controller-runtime's metrics server does, a component given no certificate makes
one for itself at start: an ECDSA P-256 key and a certificate for its own host names, valid for
a year, written to a private temporary directory (mode 0700) and gone with the process. Nothing
can verify it, so the scraper skips verification (the chart's PodMonitors set
``tlsConfig.insecureSkipVerify``); the bearer token, not the certificate, is what keeps tenants
out. To have scrapers verify the server, mount a certificate signed by a CA they trust and pass
``--metrics-tls-cert-file`` and ``--metrics-tls-private-key-file``.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

VALID_DAYS = 365
"""A year: longer than any pod lives between restarts, which make a new one."""


@dataclass(frozen=True)
class ServingCert:
    """PEM files of a serving certificate and its key, as uvicorn reads them."""

    cert_file: Path
    key_file: Path
    self_signed: bool = False


class ServingCertError(Exception):
    """A certificate flag is missing its pair, or a file cannot be read."""


def serving_cert(cert_file: str | None, key_file: str | None, *, name: str) -> ServingCert:
    """The mounted pair when both files are given, else a self-signed one made now."""
    if bool(cert_file) != bool(key_file):
        given = "--metrics-tls-cert-file" if cert_file else "--metrics-tls-private-key-file"
        raise ServingCertError(
            f"{given} was given alone: give both --metrics-tls-cert-file and "
            "--metrics-tls-private-key-file, or neither for a self-signed certificate"
        )
    if cert_file and key_file:
        for path in (cert_file, key_file):
            if not os.access(path, os.R_OK):
                raise ServingCertError(f"cannot read {path}: mount the certificate's Secret there")
        return ServingCert(Path(cert_file), Path(key_file))
    return self_signed(name)


def self_signed(name: str, hosts: tuple[str, ...] = ()) -> ServingCert:
    """Make a key and a certificate for ``name``, this host and ``hosts`` in a private dir."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    dns = {name, "localhost", socket.gethostname(), *(h for h in hosts if not _is_ip(h))}
    ips = {"127.0.0.1", "::1", *(h for h in hosts if _is_ip(h))}
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(d) for d in sorted(dns)]
                + [x509.IPAddress(ipaddress.ip_address(i)) for i in sorted(ips)]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    where = Path(tempfile.mkdtemp(prefix="gpushare-metrics-tls-"))  # mode 0700
    cert_file, key_file = where / "tls.crt", where / "tls.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.touch(mode=0o600)
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return ServingCert(cert_file, key_file, self_signed=True)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
