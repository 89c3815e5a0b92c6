"""A CA and a serving certificate signed by it (openssl), for the webhook's TLS."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def serving_pki(root: Path) -> tuple[Path, Path, Path]:
    """A CA and a serving certificate for 127.0.0.1 signed by it: (ca, cert, key)."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=gpushare-webhook-e2e-ca", cwd=root,
    )  # fmt: skip
    _openssl(
        "req", *ec, "-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=gpushare-webhook",
        cwd=root,
    )  # fmt: skip
    (root / "tls.ext").write_text(
        "extendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
    )
    _openssl(
        "x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "tls.crt", "-days", "2", "-extfile", "tls.ext", cwd=root,
    )  # fmt: skip
    return root / "ca.crt", root / "tls.crt", root / "tls.key"
