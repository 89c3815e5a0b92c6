"""The extender's HTTP service (FastAPI): filter, prioritize, bind, inspect and probes.

Routes are the verbs configured in ``KubeSchedulerConfiguration`` (``filterVerb: filter`` and
so on) under the extender's ``urlPrefix``. The cache runs as a background task for the app's
lifetime when ``run_cache`` is set; tests drive it by hand instead.

Every route is ``async`` on purpose: FastAPI would run plain functions in a thread pool, where
they would read the cache while the watch task changes it. On the event loop they never race.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Receive, Scope, Send

from gpushare.extender.autoscaling import Autoscaling
from gpushare.extender.draallocator import DraAllocator, Round
from gpushare.extender.metrics import DraSource
from gpushare.extender.service import Extender
from gpushare.extender.wire import (
    WireError,
    binding_json,
    filter_json,
    openapi_components,
    priorities_json,
    read_args,
    read_binding_args,
)
from gpushare.inspect.dramode import DraView, read_dra
from gpushare.inspect.view import build_view, to_json
from gpushare.kube.metricsguard import MetricsGuard
from gpushare.kube.policies import PolicyWatch
from gpushare.scraping import GuardCollector, guarded, tls_options
from gpushare.servingcert import ServingCert

log = logging.getLogger(__name__)


def server_config(
    app: Any, *, host: str, port: int, log_level: str, cert: ServingCert | None = None
) -> uvicorn.Config:
    """How ``gpushare extender`` serves the app (the benchmarks serve it the same way).

    uvloop and httptools (C event loop and HTTP parser) leave more of each call to the
    decision; the access log, a line per call at thousands of calls a minute, only at debug
    (the request metrics count the calls). ``cert``: over HTTPS (the metrics port).
    """
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        # none of its own: its records reach the root handler of --log-format (cli.logs)
        log_config=None,
        loop="uvloop",
        http="httptools",
        access_log=log_level.lower() == "debug",
        **tls_options(cert),  # type: ignore[arg-type]
    )


def _json(body: str | bytes) -> Response:
    return Response(content=body, media_type="application/json")


def _invalid(err: WireError) -> Response:
    """400: the body is not the wire format (kube-scheduler logs the message)."""
    return JSONResponse({"detail": err.detail()}, status_code=400)


_VERB_SCHEMAS, _COMPONENTS = openapi_components()


def _documented(verb: str) -> dict[str, Any]:
    """The OpenAPI entry of a verb that reads and writes its own bytes (``wire``'s schemas)."""
    schemas = _VERB_SCHEMAS[verb]
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": schemas["request"]}},
        },
        "responses": {
            "200": {
                "description": "Successful Response",
                "content": {"application/json": {"schema": schemas["reply"]}},
            }
        },
    }


MAX_BODY_BYTES = 8 * 1024 * 1024
"""The largest request body read. kube-scheduler sends a pod (etcd keeps at most 1.5 MiB of
one) and node names (``nodeCacheCapable``: about 1 MiB at 15,000 nodes); anything larger is not
a call kube-scheduler makes, and is refused before it is held in memory or parsed."""


def _too_large(limit: int) -> Response:
    """413: the body is over ``limit`` bytes."""
    detail = [
        {
            "loc": ["body"],
            "msg": f"body: more than {limit} bytes; kube-scheduler's calls are far smaller "
            f"(set nodeCacheCapable: true so it sends node names, not node objects)",
            "type": "too_large",
        }
    ]
    return JSONResponse({"detail": detail}, status_code=413)


Verb = Callable[[bytes], Awaitable[Response]]
"""A verb's work: the request body in, the response out."""

_JSON_HEADER = (b"content-type", b"application/json")


class _ExtenderApp(FastAPI):
    """FastAPI with the wire structs' components in the OpenAPI page (the verbs refer to them),
    and a short way in for the three verbs.

    kube-scheduler calls filter and prioritize on every pod while it waits: each goes from the
    ASGI call straight to its ``Verb``, past the router, the middleware stack and FastAPI's
    request handling (6 % of the extender's samples under a burst of pods). They are still
    FastAPI routes too, which the OpenAPI page describes and which answer any other method.
    """

    verbs: dict[str, Verb]
    max_body_bytes: int = MAX_BODY_BYTES

    def openapi(self) -> dict[str, Any]:
        schema = super().openapi()
        schema.setdefault("components", {}).setdefault("schemas", {}).update(_COMPONENTS)
        return schema

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        verb = None
        if scope["type"] == "http" and scope["method"] == "POST":
            verb = getattr(self, "verbs", {}).get(scope["path"])
        if verb is None:
            await super().__call__(scope, receive, send)
            return
        chunks = []
        size = 0
        response = None
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # kube-scheduler gave up on the call; nothing to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                response = _too_large(self.max_body_bytes)
                break
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        if response is None:
            response = await verb(b"".join(chunks))
        body = bytes(response.body)
        headers = [_JSON_HEADER, (b"content-length", str(len(body)).encode())]
        await send(
            {"type": "http.response.start", "status": response.status_code, "headers": headers}
        )
        await send({"type": "http.response.body", "body": body})


def _route(verb: Verb, limit: int) -> Callable[[Request], Awaitable[Response]]:
    """A verb as a FastAPI route (for other methods' 405 and the OpenAPI page)."""

    async def route(request: Request) -> Response:
        chunks = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                return _too_large(limit)
            chunks.append(chunk)
        return await verb(b"".join(chunks))

    return route


def _exposition(chunks: list[bytes]) -> StreamingResponse:
    """``/metrics``' answer, its pieces sent one by one (uvicorn writes each as it comes)."""

    async def pieces() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    return StreamingResponse(pieces(), media_type=CONTENT_TYPE_LATEST)


def create_metrics_app(extender: Extender, guard: MetricsGuard | None = None) -> ASGIApp:
    """``/metrics`` alone, for a port Prometheus may reach while the verbs stay on 127.0.0.1.

    It runs on the same event loop as the extender: a scrape reads each node whole between two
    of the watch's changes (``GpuSeries``). With ``guard``, only identities allowed
    ``get /metrics`` read it (``scraping``); ``/healthz`` stays open.
    """
    app = FastAPI(title="gpushare extender metrics", openapi_url=None)

    @app.get("/metrics")
    async def metrics() -> Response:
        return _exposition(await extender.metrics.exposition())

    @app.get("/healthz", response_class=PlainTextResponse)
    async def healthz() -> str:
        return "ok"

    if guard is None:
        return app
    extender.metrics.registry.register(GuardCollector(guard))
    return guarded(app, guard)


def follow_dra(extender: Extender, allocator: DraAllocator) -> DraSource:
    """DRA mode's nodes and holdings as the allocator follows them (its watches of slices,
    claims and DRA nodes), for ``GET /inspect`` and the metrics, and its rounds counted."""

    def source() -> DraView | None:
        if not (allocator.slices.synced and allocator.claims.synced):
            return None
        return read_dra(
            allocator.slices.objects.values(),
            allocator.claims.objects.values(),
            allocator.nodes.objects.values(),
            unit=extender.scheduler.settings.unit,
        )

    def counted(done: Round) -> None:
        extender.metrics.count_dra(
            allocated=len(done.allocated),
            refused=len(done.refused),
            held=len(done.held_anew),
            not_ours=len(done.not_ours),
        )

    extender.metrics.follow_dra(source)
    allocator.on_round = counted
    return source


def create_app(
    extender: Extender,
    *,
    run_cache: bool = False,
    policies: PolicyWatch | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    autoscaling: Autoscaling | None = None,
    dra_allocator: DraAllocator | None = None,
) -> FastAPI:
    """Build the ASGI app around an extender (``policies``: the ResourcePolicy watch to run)."""

    running: list[asyncio.Task[None]] = []
    """The watches, which run forever: one that ended leaves the cache stale, so not ready."""

    def _take(change: Any) -> None:
        """Each change the cache took in: to the extender, and to the DRA allocator."""
        extender.take(change)
        if dra_allocator is not None:
            dra_allocator.take(change)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        tasks = []
        if run_cache:
            tasks = [
                asyncio.create_task(extender.cache.run(_take)),
                asyncio.create_task(_freeze()),
                asyncio.create_task(extender.keep_intents()),
            ]
            running.extend((tasks[0], tasks[2]))
        if policies is not None:
            tasks.append(asyncio.create_task(policies.run()))
            running.append(tasks[-1])
        if autoscaling is not None and run_cache:
            tasks.append(asyncio.create_task(autoscaling.run()))
        if dra_allocator is not None and run_cache:
            tasks.append(asyncio.create_task(dra_allocator.run()))
            running.append(tasks[-1])
        for task in running:
            task.add_done_callback(_log_end)
        try:
            yield
        finally:
            running.clear()
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task  # one that failed was logged when it ended

    async def _freeze() -> None:
        """Once the cache has listed, keep what it built out of later full collections.

        Python's full collection walks every tracked object: with thousands of nodes and pods
        in the cache that is a pause of 50-90 ms in the middle of a filter call. Frozen objects
        are still freed when unreferenced; only cycles among them would stay.
        """
        while not extender.cache.synced:
            await asyncio.sleep(0.05)
        gc.collect()
        gc.freeze()

    app = _ExtenderApp(title="gpushare extender", lifespan=lifespan)
    latency = extender.metrics.latency

    # the verbs read their bodies themselves (``read_args``, ``read_binding_args``), so every
    # bad body is a 400 naming the field; they also write their replies as bytes: FastAPI
    # would parse, then validate thousands of names, and validate the large reply once more
    async def filter_(body: bytes) -> Response:
        start = time.perf_counter()
        try:
            return _json(filter_json(extender.filter(read_args(body))))
        except WireError as err:
            return _invalid(err)
        finally:
            latency.labels("filter").observe(time.perf_counter() - start)

    async def prioritize(body: bytes) -> Response:
        start = time.perf_counter()
        try:
            return _json(priorities_json(*extender.prioritize(read_args(body))))
        except WireError as err:
            return _invalid(err)
        finally:
            latency.labels("prioritize").observe(time.perf_counter() - start)

    async def bind(body: bytes) -> Response:
        start = time.perf_counter()
        try:
            return _json(binding_json(await extender.bind(read_binding_args(body))))
        except WireError as err:
            return _invalid(err)
        finally:
            latency.labels("bind").observe(time.perf_counter() - start)

    app.verbs = {"/filter": filter_, "/prioritize": prioritize, "/bind": bind}
    app.max_body_bytes = max_body_bytes
    for path, verb in app.verbs.items():
        name = path.strip("/")
        app.add_api_route(
            path,
            _route(verb, max_body_bytes),
            methods=["POST"],
            name=name,
            openapi_extra=_documented(name),
        )

    dra_source = follow_dra(extender, dra_allocator) if dra_allocator is not None else None

    @app.get("/inspect")
    async def inspect() -> dict[str, Any]:
        state = extender.cache.state
        unit = extender.scheduler.settings.unit
        units = state.book.recorded_units() if state.book is not None else {}
        dra = dra_source() if dra_source is not None else None
        if dra is None or not dra.present:
            return to_json(build_view(state.nodes.values(), state.ledger, unit=unit, units=units))
        # the claims as followed now: what the allocator's next round books as well
        dra.book(state.ledger)
        nodes = dra.merge(state.nodes.values())
        return to_json(build_view(nodes, state.ledger, unit=unit, units=units, dra=dra))

    @app.get("/healthz", response_class=PlainTextResponse)
    async def healthz() -> str:
        return "ok"

    @app.get("/readyz")
    async def readyz() -> Response:
        stopped = [t for t in running if t.done()]
        if stopped:
            reason = f"a background task stopped: {_ended(stopped[0])}"
        elif extender.cache.problem:
            reason = f"cache: {extender.cache.problem}"
        elif refused := extender.cache.health.problem():
            reason = refused
        elif not extender.cache.synced:
            reason = "cache has not listed nodes and pods yet"
        elif policies is not None and not policies.listed:
            reason = "ResourcePolicies not listed yet"
        else:
            return PlainTextResponse("ok")
        return JSONResponse({"ready": False, "reason": reason}, status_code=503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return _exposition(await extender.metrics.exposition())

    return app


def _ended(task: asyncio.Task[None]) -> str:
    """How a background task ended, for ``/readyz``."""
    if task.cancelled():
        return "cancelled"
    err = task.exception()
    return f"{type(err).__name__}: {err}"[:300] if err else "returned"


def _log_end(task: asyncio.Task[None]) -> None:
    """Say, once, that a watch that should run forever ended (not at shutdown)."""
    if not task.cancelled():
        log.error("background task %s ended: %s; /readyz fails", task.get_name(), _ended(task))
