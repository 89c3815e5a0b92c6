"""GPU pods and their reviews by user, for the tampering and isolation-path tests."""

from __future__ import annotations

from typing import Any

from gpushare.core.admitting.admission import AdmissionSettings, decide

TENANT = "system:serviceaccount:team-a:default"
MEM = "aliyun.com/gpu-mem"


def gpu_pod(
    *,
    limits: dict[str, Any] | None = None,
    env: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    node: str = "",
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": "cuda",
        "resources": {"limits": {MEM: "1"} if limits is None else limits},
    }
    if env is not None:
        container["env"] = env
    spec: dict[str, Any] = {"schedulerName": "ack-co-scheduler", "containers": [container]}
    if node:
        spec["nodeName"] = node
    metadata: dict[str, Any] = {"name": "p", "namespace": "team-a"}
    if annotations is not None:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def review(
    obj: dict[str, Any],
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
    *,
    user: str = TENANT,
    groups: tuple[str, ...] = ("system:serviceaccounts", "system:serviceaccounts:team-a"),
    sub_resource: str = "",
) -> dict[str, Any]:
    kind = obj["kind"]
    request: dict[str, Any] = {
        "uid": "b5e2a1f0-0000-4000-8000-000000000001",
        "kind": {"group": "", "version": "v1", "kind": kind},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "name": obj["metadata"]["name"],
        "namespace": obj["metadata"]["namespace"],
        "operation": operation,
        "userInfo": {"username": user, "groups": list(groups)},
        "object": obj,
        "oldObject": old,
    }
    if sub_resource:
        request["subResource"] = sub_resource
        request["requestSubResource"] = sub_resource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def refused(request: dict[str, Any], settings: AdmissionSettings | None = None) -> str:
    response = answer(request, settings)
    assert response["allowed"] is False, response
    assert response["status"]["code"] == 403 and response["status"]["reason"] == "Forbidden"
    message: str = response["status"]["message"]
    return message


def answer(request: dict[str, Any], settings: AdmissionSettings | None = None) -> dict[str, Any]:
    result: dict[str, Any] = decide(request, settings).review["response"]
    return result
