"""The webhook's DRA routes in-process over ASGI, with an in-memory template store.

``/mutate-dra-namespace`` converts a pod and creates its ResourceClaimTemplate before it
answers: once per shape (a second pod of the same shape finds it, AlreadyExists with the same
spec is success), never on a dry run, and a pod whose template cannot be made (a stored one of
that name with another spec, RBAC) is refused with the reason.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Mapping
from typing import Any

import httpx

from gpushare.core.admitting.admission import AdmissionSettings
from gpushare.core.admitting.draconverting import DraSettings
from gpushare.kube.port import Conflict, Forbidden, KubeDict, NotFound
from gpushare.webhook.app import create_app
from tests.support.tampering import MEM, gpu_pod, review


class Templates:
    """ResourceClaimTemplates by (namespace, name), as the API server keeps them."""

    def __init__(self, *, forbidden: bool = False) -> None:
        self.stored: dict[tuple[str, str], KubeDict] = {}
        self.creates = 0
        self.forbidden = forbidden

    async def create_claim_template(self, template: Mapping[str, Any]) -> KubeDict:
        self.creates += 1
        if self.forbidden:
            raise Forbidden("create resourceclaimtemplate: forbidden")
        key = (template["metadata"]["namespace"], template["metadata"]["name"])
        if key in self.stored:
            raise Conflict(f"{key} already exists")
        stored = copy.deepcopy(dict(template))
        stored["spec"].setdefault("metadata", {})  # as kube-apiserver v1.36.3 stores it
        self.stored[key] = stored
        return self.stored[key]

    async def get_claim_template(self, namespace: str, name: str) -> KubeDict:
        if (namespace, name) not in self.stored:
            raise NotFound(name)
        return self.stored[(namespace, name)]


def seed_pod(name: str = "p") -> dict[str, Any]:
    pod = gpu_pod()
    pod["metadata"]["name"] = name
    pod["spec"]["containers"][0]["resources"] = {"limits": {MEM: "3"}}
    return pod


def post(
    templates: Templates, *bodies: dict[str, Any], path: str = "/mutate-dra-namespace"
) -> list[Any]:
    app = create_app(AdmissionSettings(), dra=DraSettings(), templates=templates)

    async def run() -> list[Any]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="https://webhook") as client:
            return [
                (await client.post(path, content=json.dumps(b).encode())).json()["response"]
                for b in bodies
            ]

    return asyncio.run(run())


def test_the_template_is_created_once_per_shape() -> None:
    templates = Templates()
    first, second = post(templates, review(seed_pod("a")), review(seed_pod("b")))
    assert first["allowed"] and second["allowed"] and "patch" in second
    assert templates.creates == 2 and len(templates.stored) == 1
    ((namespace, name),) = templates.stored
    assert namespace == "team-a" and name.startswith("gpushare-")


def test_a_dry_run_creates_nothing() -> None:
    templates = Templates()
    body = review(seed_pod())
    body["request"]["dryRun"] = True
    (answer,) = post(templates, body)
    assert answer["allowed"] and "patch" in answer and templates.creates == 0


def test_a_template_that_cannot_be_made_refuses_the_pod_with_the_reason() -> None:
    (answer,) = post(Templates(forbidden=True), review(seed_pod()))
    assert answer["allowed"] is False
    assert "could not create the ResourceClaimTemplate" in answer["status"]["message"]
    assert "forbidden" in answer["status"]["message"]
    clashing = Templates()
    post(clashing, review(seed_pod()))
    (stored,) = clashing.stored.values()
    stored["spec"] = {"spec": {"devices": {"requests": []}}}
    (answer,) = post(clashing, review(seed_pod()))
    assert answer["allowed"] is False and "exists with another spec" in answer["status"]["message"]


def test_the_dra_routes_exist_only_in_dra_mode() -> None:
    app = create_app(AdmissionSettings())

    async def run() -> int:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="https://webhook") as client:
            return (await client.post("/mutate-dra", content=b"{}")).status_code

    assert asyncio.run(run()) in (404, 405)
    (answer,) = post(Templates(), review(seed_pod()), path="/mutate-dra")
    assert answer["allowed"] and "patch" not in answer  # not in DRA mode by itself
