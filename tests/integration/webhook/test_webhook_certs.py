"""The webhook serves a renewed certificate without a restart (issue 40).

A real uvicorn server with TLS, its certificate files swapped as kubelet swaps a Secret volume
(a new ``..data`` directory, then one rename of the link), and a client that trusts only the
new CA: before the reloader, every handshake after a renewal with a new CA failed until the
webhook restarted.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest
import uvicorn

from gpushare.core.admitting.admission import AdmissionSettings
from gpushare.core.model.names import DEFAULT_NAMES
from gpushare.core.model.units import MemoryUnit
from gpushare.webhook.app import WebhookMetrics, create_app, serve, server_config
from gpushare.webhook.certs import CertificateReloader

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def issue(where: Path, name: str) -> tuple[Path, Path, Path]:
    """A CA and a serving certificate for 127.0.0.1 it signed: (ca, cert, key)."""
    where.mkdir(parents=True, exist_ok=True)
    ca_key, ca = where / f"{name}-ca.key", where / f"{name}-ca.crt"
    key, csr, cert = where / f"{name}.key", where / f"{name}.csr", where / f"{name}.crt"
    ext = where / f"{name}.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca),
        "-days", "1", "-subj", f"/CN={name}-ca")  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
        "-subj", "/CN=gpushare-webhook")  # fmt: skip
    run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-out", str(cert), "-days", "1", "-extfile", str(ext))  # fmt: skip
    return ca, cert, key


def mount(volume: Path, cert: Path, key: Path, generation: int) -> None:
    """Put a pair in a Secret-like volume: files under a new directory, one link renamed."""
    data = volume / f"..{generation}"
    data.mkdir()
    shutil.copy(cert, data / "tls.crt")
    shutil.copy(key, data / "tls.key")
    link = volume / "..data_tmp"
    link.symlink_to(data.name)
    os.replace(link, volume / "..data")
    for name in ("tls.crt", "tls.key"):
        if not (volume / name).is_symlink():
            (volume / name).symlink_to(f"..data/{name}")


def handshake(port: int, ca: Path) -> str:
    """ "ok", or why a client trusting only ``ca`` could not connect."""
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1"),
        ):
            return "ok"
    except ssl.SSLError as err:
        return err.reason or str(err)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_a_renewed_certificate_with_a_new_ca_is_served_without_a_restart(tmp_path: Path) -> None:
    old_ca, old_cert, old_key = issue(tmp_path / "pki", "old")
    new_ca, new_cert, new_key = issue(tmp_path / "pki", "new")
    volume = tmp_path / "volume"
    volume.mkdir()
    mount(volume, old_cert, old_key, 1)
    metrics = WebhookMetrics()
    reloader = CertificateReloader(
        volume / "tls.crt",
        volume / "tls.key",
        reloads=metrics.certificate_reloads,
        loaded_at=metrics.certificate_loaded,
    )
    port = free_port()
    settings = AdmissionSettings(names=DEFAULT_NAMES, unit=MemoryUnit.GiB)
    config = server_config(
        create_app(settings, metrics),
        host="127.0.0.1",
        port=port,
        cert_file=str(volume / "tls.crt"),
        key_file=str(volume / "tls.key"),
        log_level="warning",
        reloader=reloader,
    )
    server = uvicorn.Server(config)

    async def main() -> dict[str, object]:
        task = asyncio.create_task(serve(config, reloader, server))
        for _ in range(100):
            await asyncio.sleep(0.05)
            if await asyncio.to_thread(handshake, port, old_ca) == "ok":
                break
        seen: dict[str, object] = {"before": await asyncio.to_thread(handshake, port, new_ca)}
        # a half-written renewal: the new certificate beside the old key
        mount(volume, new_cert, old_key, 2)
        seen["half"] = reloader.check()
        seen["half_old_ca"] = await asyncio.to_thread(handshake, port, old_ca)
        mount(volume, new_cert, new_key, 3)
        renewed = time.monotonic()
        while await asyncio.to_thread(handshake, port, new_ca) != "ok":
            assert time.monotonic() - renewed < 10, "the new certificate was never served"
            await asyncio.sleep(0.1)
        seen["served_after_s"] = time.monotonic() - renewed
        seen["old_ca_after"] = await asyncio.to_thread(handshake, port, old_ca)
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        return seen

    seen = asyncio.run(main())
    print(seen)
    assert seen["before"] == "CERTIFICATE_VERIFY_FAILED"  # the client trusts only the new CA
    assert str(seen["half"]).startswith("failed: SSLError")
    assert seen["half_old_ca"] == "ok"  # the last good pair kept serving
    assert isinstance(seen["served_after_s"], float) and seen["served_after_s"] < 5
    assert seen["old_ca_after"] == "CERTIFICATE_VERIFY_FAILED"
    assert metrics.certificate_reloads.labels("loaded")._value.get() >= 1
    assert metrics.certificate_reloads.labels("failed")._value.get() >= 1
