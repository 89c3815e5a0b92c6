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
import time
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

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
from gpushare.inspect.view import build_view, to_json
from gpushare.kube.policies import PolicyWatch


def server_config(app: Any, *, host: str, port: int, log_level: str) -> uvicorn.Config:
    """How ``gpushare extender`` serves the app (the benchmarks serve it the same way).

    uvloop and httptools (C event loop and HTTP parser) leave more of each call to the
    decision; the access log, a line per call at thousands of calls a minute, only at debug
    (the request metrics count the calls).
    """
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        loop="uvloop",
        http="httptools",
        access_log=log_level.lower() == "debug",
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


class _ExtenderApp(FastAPI):
    """FastAPI with the wire structs' components in the OpenAPI page (the verbs refer to them)."""

    def openapi(self) -> dict[str, Any]:
        schema = super().openapi()
        schema.setdefault("components", {}).setdefault("schemas", {}).update(_COMPONENTS)
        return schema


def create_metrics_app(extender: Extender) -> FastAPI:
    """``/metrics`` alone, for a port Prometheus may reach while the verbs stay on 127.0.0.1.

    It runs on the same event loop as the extender, so scrapes never read the cache while the
    watch changes it.
    """
    app = FastAPI(title="gpushare extender metrics", openapi_url=None)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(extender.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def create_app(
    extender: Extender, *, run_cache: bool = False, policies: PolicyWatch | None = None
) -> FastAPI:
    """Build the ASGI app around an extender (``policies``: the ResourcePolicy watch to run)."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        tasks = []
        if run_cache:
            tasks = [asyncio.create_task(extender.cache.run()), asyncio.create_task(_freeze())]
        if policies is not None:
            tasks.append(asyncio.create_task(policies.run()))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

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
    # bad body is a 400 naming the field; filter and prioritize also write their replies as
    # bytes: FastAPI would parse, then validate thousands of names, and validate the large
    # reply once more
    @app.post("/filter", openapi_extra=_documented("filter"))
    async def filter_(request: Request) -> Response:
        start = time.perf_counter()
        try:
            args = read_args(await request.body())
            return _json(filter_json(extender.filter(args)))
        except WireError as err:
            return _invalid(err)
        finally:
            latency.labels("filter").observe(time.perf_counter() - start)

    @app.post("/prioritize", openapi_extra=_documented("prioritize"))
    async def prioritize(request: Request) -> Response:
        start = time.perf_counter()
        try:
            args = read_args(await request.body())
            return _json(priorities_json(*extender.prioritize(args)))
        except WireError as err:
            return _invalid(err)
        finally:
            latency.labels("prioritize").observe(time.perf_counter() - start)

    @app.post("/bind", openapi_extra=_documented("bind"))
    async def bind(request: Request) -> Response:
        start = time.perf_counter()
        try:
            args = read_binding_args(await request.body())
            return _json(binding_json(await extender.bind(args)))
        except WireError as err:
            return _invalid(err)
        finally:
            latency.labels("bind").observe(time.perf_counter() - start)

    @app.get("/inspect")
    async def inspect() -> dict[str, Any]:
        cache = extender.cache
        unit = extender.scheduler.settings.unit
        units = cache.book.recorded_units() if cache.book is not None else {}
        return to_json(build_view(cache.nodes.values(), cache.ledger, unit=unit, units=units))

    @app.get("/healthz", response_class=PlainTextResponse)
    async def healthz() -> str:
        return "ok"

    @app.get("/readyz")
    async def readyz() -> Response:
        if not extender.cache.synced:
            reason = "cache has not listed nodes and pods yet"
        elif policies is not None and not policies.listed:
            reason = "ResourcePolicies not listed yet"
        else:
            return PlainTextResponse("ok")
        return JSONResponse({"ready": False, "reason": reason}, status_code=503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(extender.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
