"""ResourcePolicy objects and the nodes their units select, for the policy and reserve tests."""

from __future__ import annotations

from typing import Any

from gpushare.kube.objects import gpu_node


def policy_obj(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "selector": {"app": "web"},
        "strategy": "prefer",
        "units": [
            {"resource": "ecs", "nodeSelector": {"pool": "a"}, "max": 2},
            {"resource": "ecs", "nodeSelector": {"pool": "b"}},
        ],
    }
    body.update(spec)
    return {
        "apiVersion": "scheduling.alibabacloud.com/v1alpha1",
        "kind": "ResourcePolicy",
        "metadata": {
            "name": "web",
            "namespace": "default",
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": body,
    }


def node(name: str, pool: str) -> dict[str, Any]:
    obj = gpu_node(name, gpus_units=[16])
    obj["metadata"].setdefault("labels", {})["pool"] = pool
    return obj
