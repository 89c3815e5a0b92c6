"""Small helpers shared by the end-to-end tests."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from harness.cluster import Cluster


def gpu_pod_manifest(
    name: str, namespace: str, mem: int, *, selector: dict[str, str], core: int | None = None
) -> dict[str, Any]:
    limits: dict[str, Any] = {"aliyun.com/gpu-mem": mem}
    if core is not None:
        limits["aliyun.com/gpu-core.percentage"] = core
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "e2e"}},
        "spec": {
            "schedulerName": "ack-co-scheduler",
            "nodeSelector": selector,
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}],
        },
    }


def apply_all(cluster: Cluster, manifests: list[dict[str, Any]], timeout: float = 300) -> None:
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests})
    cluster.kubectl("create", "-f", "-", input=body, timeout=timeout)


def pods(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.kubectl_json("get", "pods", "-n", namespace)["items"]
    return items


def per_gpu_memory(items: list[dict[str, Any]]) -> dict[tuple[str, int], int]:
    """Memory booked per (node, GPU), summed from the pods' own annotations."""
    held: dict[tuple[str, int], int] = defaultdict(int)
    for pod in items:
        record = (pod["metadata"].get("annotations") or {}).get("gpushare.io/allocation")
        if record and pod["spec"].get("nodeName"):
            data = json.loads(record)
            assert data["node"] == pod["spec"]["nodeName"]
            for share in data["gpus"]:
                held[(data["node"], share["index"])] += share["mem"]
    return dict(held)


def scrape_with_token(url: str, token: str = "", timeout: float = 10) -> tuple[int, str]:
    """GET a guarded /metrics over HTTPS as Prometheus does with the chart's PodMonitors
    (``Authorization: Bearer``, the self-signed certificate not verified): status and body."""
    import ssl
    import urllib.error
    import urllib.request

    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, context=context, timeout=timeout) as reply:
            return int(reply.status), reply.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
