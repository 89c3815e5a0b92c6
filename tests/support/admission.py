"""AdmissionReview requests of pods and workloads, for the admission tests."""

from __future__ import annotations

from typing import Any

MEM = "aliyun.com/gpu-mem"


def container(limits: dict[str, Any] | None = None, name: str = "main") -> dict[str, Any]:
    resources = {"limits": limits} if limits is not None else {}
    return {"name": name, "image": "busybox", "resources": resources}


def pod_template(
    *containers: dict[str, Any],
    scheduler: str | None = "ack-co-scheduler",
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"metadata": {"labels": labels or {}}, "spec": spec}


def pod(name: str, template: dict[str, Any]) -> dict[str, Any]:
    meta = {"name": name, "namespace": "team-a", **template["metadata"]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}


def job(name: str, template: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"template": {**template, "spec": {**template["spec"], "restartPolicy": "Never"}}},
    }


def review(
    obj: dict[str, Any], operation: str = "CREATE", old: dict[str, Any] | None = None
) -> dict[str, Any]:
    kind = obj["kind"]
    group, resource = GROUPS.get(kind, ("apps", kind.lower() + "s"))
    request: dict[str, Any] = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": group, "version": "v1", "kind": kind},
        "resource": {"group": group, "version": "v1", "resource": resource},
        "name": obj["metadata"]["name"],
        "namespace": obj["metadata"]["namespace"],
        "operation": operation,
        "userInfo": {"username": "admin"},
        "object": obj,
        "oldObject": old,
        "dryRun": False,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


GROUPS = {"Pod": ("", "pods"), "Job": ("batch", "jobs"), "CronJob": ("batch", "cronjobs")}
