"""The webhook's serving certificate, served anew when its files change.

cert-manager and the chart's certificate Job renew the certificate by replacing its Secret;
kubelet then swaps the mounted files (the volume's ``..data`` link, atomically) within about a
minute (12-14 s were seen). uvicorn reads the files once, when it starts, so a webhook that kept
its first certificate failed every admission after a renewal with a new CA (``x509: certificate
signed by unknown authority``: 82 of 82 over 180 s) until it was restarted.

:class:`CertificateReloader` owns the ``SSLContext`` uvicorn serves with and checks the files
every :data:`CHECK_S`: when their bytes changed it loads the pair into the same context, so every
TLS handshake from then on presents the new certificate and open connections keep theirs. A pair
that does not load (a certificate written before its key, a truncated file) leaves the last good
one serving, is counted and logged, and is tried again at the next check.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
from collections.abc import Callable
from pathlib import Path

from prometheus_client import Counter, Gauge

log = logging.getLogger(__name__)

CHECK_S = 2.0
"""How often the files are compared: a renewal is served within this of kubelet's update."""


class CertificateReloader:
    """The serving context, and what reloads it."""

    def __init__(
        self,
        cert_file: str | Path,
        key_file: str | Path,
        *,
        reloads: Counter | None = None,
        loaded_at: Gauge | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.cert_file = Path(cert_file)
        self.key_file = Path(key_file)
        self.context: ssl.SSLContext | None = None
        self.reloads = reloads
        self.loaded_at = loaded_at
        self.clock = clock
        self._digest = ""

    def _read(self) -> tuple[str, tuple[bytes, bytes]]:
        cert, key = self.cert_file.read_bytes(), self.key_file.read_bytes()
        return hashlib.sha256(cert + b"\0" + key).hexdigest(), (cert, key)

    def adopt(self, context: ssl.SSLContext) -> ssl.SSLContext:
        """Keep the context uvicorn built from the files (its ``ssl_context_factory`` hook)."""
        self.context = context
        try:
            self._digest, _ = self._read()
        except OSError:
            self._digest = ""
        self._mark()
        return context

    def check(self) -> str:
        """Reload when the files changed: "" (unchanged), "loaded" or "failed: <why>"."""
        if self.context is None:
            return ""
        try:
            digest, _ = self._read()
        except OSError as err:
            return self._count("failed", f"cannot read {err.filename}: {err.strerror}")
        if digest == self._digest:
            return ""
        try:
            # a scratch context first: loading a certificate whose key does not match into the
            # live one would leave it serving that certificate with no key at all
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(
                str(self.cert_file), str(self.key_file)
            )
            self.context.load_cert_chain(str(self.cert_file), str(self.key_file))
        except (OSError, ssl.SSLError, ValueError) as err:
            return self._count("failed", f"{type(err).__name__}: {err}")
        self._digest = digest
        self._mark()
        log.info("phase=certificate reloaded %s", self.cert_file)
        return self._count("loaded", "")

    def _count(self, result: str, why: str) -> str:
        if self.reloads is not None:
            self.reloads.labels(result).inc()
        if why:
            log.warning("phase=certificate not reloaded from %s: %s", self.cert_file, why)
            return f"{result}: {why}"
        return result

    def _mark(self) -> None:
        if self.loaded_at is not None:
            if self.clock is None:
                self.loaded_at.set_to_current_time()
            else:
                self.loaded_at.set(self.clock())

    async def run(self, every: float = CHECK_S) -> None:
        """Check the files until cancelled."""
        while True:
            await asyncio.sleep(every)
            self.check()
