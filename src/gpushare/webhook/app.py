"""The webhook's HTTP service (FastAPI): ``POST /validate``, ``POST /mutate``, probes, metrics.

In DRA mode (``dra`` given) it also serves ``POST /mutate-dra`` and ``POST /mutate-dra-namespace``
(``core.admitting.draconverting``): the ResourceClaimTemplate of a converted pod is created
(``dratemplates``) before the patch is answered, and a pod whose template cannot be made is
refused with the reason.

The decisions are ``core.admitting.admission.decide`` and ``core.admitting.admission.mutate``; this
module only
reads the body, times the call, counts it and logs it, with the requester (``user=``) so a
refused forgery names its author. A body that is not JSON (malformed, not UTF-8, or nested
deeper than the decoder goes) is answered like any unreadable review, with an HTTP 200
AdmissionReview that denies with code 400 and says why: a non-200 reply would make the API
server apply the failure policy instead (with ``Fail``, refuse without the reason; with
``Ignore``, admit the object).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest

from gpushare.core.admitting.admission import AdmissionSettings, Decision, decide, malformed, mutate
from gpushare.core.admitting.draconverting import DraSettings, mutate_dra, refused
from gpushare.exporting import ExportRegistry
from gpushare.kube.port import ClaimTemplateAPI
from gpushare.webhook.certs import CertificateReloader
from gpushare.webhook.dratemplates import ensure_template

log = logging.getLogger(__name__)

REVIEW_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
"""Seconds; a decision takes well under a millisecond, the API server waits at most 30 s.
(The extender's calls have their own ladder, to kube-scheduler's 5 s: ``extender.metrics``.)"""


class WebhookMetrics:
    """Reviews by kind and decision, and their latency, on a registry owned by the app."""

    def __init__(self) -> None:
        self.registry = ExportRegistry("webhook")
        self.reviews = Counter(
            "gpushare_webhook_reviews_total",
            "Admission reviews by object kind and decision (allowed, warned, denied, malformed)",
            ["kind", "decision"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "gpushare_webhook_review_duration_seconds",
            "Time to read, decide and answer one admission review",
            buckets=REVIEW_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.certificate_reloads = Counter(
            "gpushare_webhook_certificate_reloads_total",
            "Serving certificate files found changed, by result (loaded, failed: the last good "
            "pair keeps serving)",
            ["result"],
            registry=self.registry,
        )
        self.certificate_loaded = Gauge(
            "gpushare_webhook_certificate_loaded_timestamp_seconds",
            "When the certificate now served was loaded (Unix time)",
            registry=self.registry,
        )


Answer = Callable[[Any, AdmissionSettings], Decision]


@dataclass(frozen=True)
class _Body:
    """A review body read as JSON."""

    data: Any


def _parse(body: bytes) -> _Body | Decision:
    """The body as JSON, or the malformed Decision saying why it is not."""
    try:
        return _Body(json.loads(body))
    except UnicodeDecodeError as err:
        where = f"byte 0x{err.object[err.start : err.start + 1].hex()} at offset {err.start}"
        return malformed("", "unknown", f"the body is not UTF-8 ({where}); send JSON as UTF-8")
    except ValueError as err:
        return malformed("", "unknown", f"the body is not JSON ({err})")
    except RecursionError:
        return malformed(
            "",
            "unknown",
            "the body is JSON nested too deeply to read; an AdmissionReview is a few dozen "
            "levels deep at most",
        )


def _review(body: bytes, settings: AdmissionSettings, answer: Answer = decide) -> Decision:
    parsed = _parse(body)
    return answer(parsed.data, settings) if isinstance(parsed, _Body) else parsed


def create_app(
    settings: AdmissionSettings,
    metrics: WebhookMetrics | None = None,
    *,
    dra: DraSettings | None = None,
    templates: ClaimTemplateAPI | None = None,
) -> FastAPI:
    """Build the ASGI app for these admission settings (and DRA mode's, when given)."""
    metrics = metrics or WebhookMetrics()
    app = FastAPI(title="gpushare admission webhook", docs_url=None, redoc_url=None)
    app.state.metrics = metrics

    def answer(body: bytes, phase: str, how: Answer) -> Response:
        started = time.perf_counter()
        return sent(_review(body, settings, how), phase, started)

    def sent(decision: Decision, phase: str, started: float) -> Response:
        metrics.reviews.labels(decision.kind, decision.decision).inc()
        metrics.latency.observe(time.perf_counter() - started)
        response = decision.review["response"]
        log.log(
            logging.INFO if decision.decision != "allowed" else logging.DEBUG,
            "uid=%s kind=%s user=%s decision=%s phase=%s %s",
            response.get("uid", ""),
            decision.kind,
            decision.user,
            decision.decision,
            phase,
            "; ".join(decision.reasons),
        )
        return Response(content=json.dumps(decision.review), media_type="application/json")

    @app.post("/validate")
    async def validate(request: Request) -> Response:
        return answer(await request.body(), "admission", decide)

    @app.post("/mutate")
    async def mutate_route(request: Request) -> Response:
        return answer(await request.body(), "mutation", mutate)

    async def convert(body: bytes, namespace_selected: bool) -> Response:
        started = time.perf_counter()
        parsed = _parse(body)
        if not isinstance(parsed, _Body):
            return sent(parsed, "dra", started)
        assert dra is not None
        mutation = mutate_dra(parsed.data, settings, dra, namespace_selected=namespace_selected)
        decision = mutation.decision
        if mutation.template is not None and not mutation.dry_run:
            problem = (
                "the webhook has no API client (gpushare webhook --dra-enabled needs one)"
                if templates is None
                else await ensure_template(templates, mutation.template)
            )
            if problem:
                decision = refused(mutation, problem)
        return sent(decision, "dra", started)

    if dra is not None:

        @app.post("/mutate-dra")
        async def mutate_dra_route(request: Request) -> Response:
            return await convert(await request.body(), namespace_selected=False)

        @app.post("/mutate-dra-namespace")
        async def mutate_dra_namespace_route(request: Request) -> Response:
            return await convert(await request.body(), namespace_selected=True)

    @app.get("/healthz", response_class=PlainTextResponse)
    async def healthz() -> str:
        return "ok"

    @app.get("/readyz", response_class=PlainTextResponse)
    async def readyz() -> str:
        # no cache to sync: the decision needs nothing but the request
        return "ok"

    @app.get("/metrics")
    async def metrics_route() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def server_config(
    app: Any,
    *,
    host: str,
    port: int,
    cert_file: str,
    key_file: str,
    log_level: str,
    reloader: CertificateReloader | None = None,
) -> uvicorn.Config:
    """How ``gpushare webhook`` serves the app: HTTPS only, as the API server requires.

    uvicorn builds the TLS context from the files once; ``reloader`` keeps that context and
    loads a renewed certificate into it (``certs``), so a renewal needs no restart.
    """
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        # none of its own: its records reach the root handler of --log-format (cli.logs)
        log_config=None,
        ssl_certfile=cert_file,
        ssl_keyfile=key_file,
        ssl_context_factory=(
            None if reloader is None else lambda _config, build: reloader.adopt(build())
        ),
        access_log=log_level.lower() == "debug",
    )


async def serve(
    config: uvicorn.Config,
    reloader: CertificateReloader | None,
    server: uvicorn.Server | None = None,
) -> None:
    """Serve until stopped, checking the certificate files while serving."""
    server = server or uvicorn.Server(config)
    checks = asyncio.create_task(reloader.run()) if reloader is not None else None
    try:
        await server.serve()
    finally:
        if checks is not None:
            checks.cancel()
