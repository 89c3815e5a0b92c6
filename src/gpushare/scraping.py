"""``/metrics`` for the monitoring stack only: the guard as ASGI middleware, its own series.

Every gpushare component that serves ``/metrics`` to the network (the extender's metrics port,
the device plugin's) wraps its ASGI app with ``guarded``: a request for ``/metrics`` gets the
guard's answer (``kube.metricsguard``: 401 without a valid token, 403 for an identity that may
not ``get /metrics``, 503 while the API server cannot be asked) before the app sees it. Every
other path passes untouched, so kubelet's probes (``/healthz``, ``/readyz``) stay open.

``GuardCollector`` exports what the guard did, which is also how the cost of the check is read:
``gpushare_metrics_reviews_total`` (TokenReviews and SubjectAccessReviews sent to the API
server) over ``gpushare_metrics_scrapes_total`` (requests answered).
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import uvicorn
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Receive, Scope, Send

from gpushare.core.admitting.metricsaccess import METRICS_PATH, ScrapeDecision
from gpushare.kube.metricsguard import MetricsGuard
from gpushare.servingcert import ServingCert

GUARD_METRICS = ("gpushare_metrics_reviews_total", "gpushare_metrics_scrapes_total")


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


async def _refuse(decision: ScrapeDecision, send: Send) -> None:
    body = json.dumps({"status": decision.status, "reason": decision.reason}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if decision.status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="gpushare metrics"'))
    await send({"type": "http.response.start", "status": decision.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


OPEN_PATHS = ("/healthz", "/readyz")
"""What kubelet's probes ask; everything else on a guarded port needs an allowed token."""


def guarded(
    app: ASGIApp, guard: MetricsGuard, *, open_paths: tuple[str, ...] = OPEN_PATHS
) -> ASGIApp:
    """``app`` answered only for requests the guard allows, but for ``open_paths``.

    Every path but the open ones is guarded, not ``/metrics`` alone: a server that answers
    any path with its series (prometheus-client's does) or a path spelled another way
    (``/metrics/``) leaks nothing.
    """

    async def guarded_app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in open_paths:
            decision = await guard.check(_header(scope, b"authorization"))
            if not decision.allowed:
                await _refuse(decision, send)
                return
        await app(scope, receive, send)

    return guarded_app


def metrics_only(metrics: ASGIApp) -> ASGIApp:
    """``/metrics`` from ``metrics``, ``/healthz`` ok, 404 elsewhere (the device plugin's port)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path == METRICS_PATH:
            await metrics(scope, receive, send)
            return
        status, body = (200, b"ok") if path in OPEN_PATHS else (404, b"not found")
        headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


class GuardCollector(Collector):
    """The guard's counters as Prometheus counters."""

    def __init__(self, guard: MetricsGuard) -> None:
        self.guard = guard

    def collect(self) -> Iterator[Metric]:
        reviews = CounterMetricFamily(
            "gpushare_metrics_reviews",
            "TokenReviews (review=token) and SubjectAccessReviews (review=access) sent to the "
            "API server to check /metrics requests; the rest were answered from the cache",
            labels=["review"],
        )
        for kind in ("token", "access"):
            reviews.add_metric([kind], self.guard.reviews[kind])
        scrapes = CounterMetricFamily(
            "gpushare_metrics_scrapes",
            "/metrics requests by outcome: allowed (200), unauthenticated (401), forbidden "
            "(403), unavailable (503: the API server could not be asked)",
            labels=["outcome"],
        )
        for outcome in ("allowed", "unauthenticated", "forbidden", "unavailable"):
            scrapes.add_metric([outcome], self.guard.outcomes[outcome])
        yield reviews
        yield scrapes


def tls_options(cert: ServingCert | None) -> dict[str, str]:
    """uvicorn's TLS settings for ``cert`` (none: plain HTTP)."""
    if cert is None:
        return {}
    return {"ssl_certfile": str(cert.cert_file), "ssl_keyfile": str(cert.key_file)}


def serve_in_thread(
    app: ASGIApp, *, host: str, port: int, cert: ServingCert | None, log_level: str = "warning"
) -> uvicorn.Server:
    """Serve ``app`` on a daemon thread with its own event loop, the port bound here first.

    Binding and listening here make a taken port fail the caller at once (``OSError``), not
    the thread later, and a scrape right after the call wait instead of being refused; the
    thread's own loop keeps scrapes off the caller's loop, as prometheus-client's server
    thread did.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)  # connections wait in the backlog until the thread's loop accepts
    except OSError:
        sock.close()
        raise
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        log_config=None,
        access_log=False,
        lifespan="off",
        **tls_options(cert),  # type: ignore[arg-type]
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="metrics-server", daemon=True
    )
    thread.start()
    return server
