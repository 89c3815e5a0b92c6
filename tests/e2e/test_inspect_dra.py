"""``kubectl inspect cgpu`` in DRA mode on the real control plane, as the plugin is installed.

kube-apiserver, kube-scheduler and kube-controller-manager v1.36.3; a kwok node labelled for DRA
mode with no gpushare inventory annotation, its GPUs in the slice its driver would publish
(``build_slice``); two pods whose claims (from ResourceClaimTemplates, no gate) the stock
scheduler's own allocator fills. ``kubectl inspect cgpu`` then shows the node and each pod's GiB
on the GPU its claim's status names, as read back from the API server; a tenant whose Role lists
pods and claims in its namespace sees its own pod, and is told that slices are hidden.
"""

from __future__ import annotations

import json
import subprocess
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from gpushare.core.dra.slices import SliceSpec, build_slice, index_of
from gpushare.core.model.inventory import Gpu, Mode
from gpushare.core.model.names import (
    ALLOCATION_MODE_DRA,
    DRA_CLAIM_NAME,
    DRA_DEVICE_CLASS,
    DRA_DRIVER,
    LABEL_ALLOCATION_MODE,
)
from gpushare.core.model.units import MemoryUnit
from harness.cluster import Cluster
from harness.identities import token_kubeconfig
from harness.seeding import KWOK_ANNOTATION, labelled_kwok_nodes
from tests.support.e2e import create_nodes, delete_nodes, eventually

NODE = "inspect-dra-0"
TEAM, OTHER = "e2e-inspect-dra-a", "e2e-inspect-dra-b"
DEVICE_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": DRA_DEVICE_CLASS},
    "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRA_DRIVER}"'}}]},
}


def _apply(cluster: Cluster, docs: list[dict[str, Any]]) -> None:
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))


def _dra_node() -> dict[str, Any]:
    """A kwok node in DRA mode: the device plugin's annotations and resources taken off."""
    [node] = labelled_kwok_nodes([NODE], "inspect-dra", gpus_units=[16, 16], mode=Mode.SHARE)
    meta = node["metadata"]
    meta["annotations"] = {KWOK_ANNOTATION: meta["annotations"][KWOK_ANNOTATION]}
    meta["labels"] = {
        k: v for k, v in meta["labels"].items() if not k.startswith(("ack.", "aliyun."))
    }
    meta["labels"][LABEL_ALLOCATION_MODE] = ALLOCATION_MODE_DRA
    for field in ("capacity", "allocatable"):
        resources = node["status"][field]
        for name in [n for n in resources if n.startswith("aliyun.com/")]:
            del resources[name]
    return node


def _template(namespace: str, gib: int) -> dict[str, Any]:
    exactly = {
        "deviceClassName": DRA_DEVICE_CLASS,
        "allocationMode": "ExactCount",
        "count": 1,
        "capacity": {"requests": {"memory": f"{gib}Gi"}},
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"gpushare-{gib}g", "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": "main", "exactly": exactly}]}}},
    }


def _pod(namespace: str, name: str, gib: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [
                {"name": DRA_CLAIM_NAME, "resourceClaimTemplateName": f"gpushare-{gib}g"}
            ],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": DRA_CLAIM_NAME, "request": "main"}]},
                }
            ],
        },
    }


def _held(cluster: Cluster, namespace: str, pod: str) -> tuple[int, int] | None:
    """(GPU index, GiB) the pod's claim holds once the pod runs, as the API server has it."""
    got = cluster.kubectl_json("get", "pod", "-n", namespace, pod)
    if (got.get("status") or {}).get("phase") != "Running":
        return None
    for entry in got["status"].get("resourceClaimStatuses") or []:
        if entry.get("name") == DRA_CLAIM_NAME and entry.get("resourceClaimName"):
            claim = cluster.kubectl_json(
                "get", "resourceclaim", "-n", namespace, entry["resourceClaimName"]
            )
            results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {})
            for result in results.get("results") or []:
                memory = str((result.get("consumedCapacity") or {}).get("memory", ""))
                index = index_of(str(result.get("device", "")))
                if result.get("pool") == NODE and memory.endswith("Gi") and index is not None:
                    return index, int(memory.removesuffix("Gi"))
    return None


def _tenant(cluster: Cluster, path: Path) -> Path:
    """A ServiceAccount of TEAM whose Role lists pods and claims there, nothing else."""
    cluster.kubectl("-n", TEAM, "create", "serviceaccount", "inspector")
    cluster.kubectl(
        "-n",
        TEAM,
        "create",
        "role",
        "inspect-dra",
        "--verb=get,list",
        "--resource=pods,resourceclaims.resource.k8s.io",
    )
    cluster.kubectl(
        "-n",
        TEAM,
        "create",
        "rolebinding",
        "inspector",
        "--role=inspect-dra",
        f"--serviceaccount={TEAM}:inspector",
    )
    token = cluster.kubectl("-n", TEAM, "create", "token", "inspector").stdout.strip()
    return token_kubeconfig(cluster, token, path, user="inspector", namespace=TEAM)


def _inspect(cluster: Cluster, *args: str, config: Path | None = None) -> str:
    env = cluster.env()
    if config is not None:
        env = {**env, "KUBECONFIG": str(config)}
    result = subprocess.run(
        [str(cluster.binaries["kubectl"]), "inspect", "cgpu", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    print(f"$ kubectl inspect cgpu {' '.join(args)}  (exit {result.returncode})")
    print(result.stdout + result.stderr)
    assert result.returncode == 0 and "Traceback" not in result.stderr
    return result.stdout


def test_inspect_shows_dra_claims_as_device_plugin_allocations(
    cluster: Cluster, tmp_path: Path
) -> None:
    node = _dra_node()
    spec = SliceSpec(
        node=NODE,
        unit=MemoryUnit.GiB,
        mode=Mode.SHARE,
        gpus=tuple(
            Gpu(index=i, mem_units=16, uuid=f"GPU-{NODE}-{i}", model="Tesla T4") for i in (0, 1)
        ),
    )
    published = build_slice(spec)
    create_nodes(cluster, [node])
    for namespace in (TEAM, OTHER):
        cluster.create_namespace(namespace)
    try:
        _apply(cluster, [DEVICE_CLASS, published])
        _apply(cluster, [_template(TEAM, 4), _template(OTHER, 6)])
        _apply(cluster, [_pod(TEAM, "train", 4), _pod(OTHER, "serve", 6)])
        held: dict[str, tuple[int, int]] = {}
        for namespace, pod in ((TEAM, "train"), (OTHER, "serve")):
            held[pod] = eventually(
                partial(_held, cluster, namespace, pod),
                90,
                f"pod {pod} running with its claim allocated by kube-scheduler",
            )
        assert held["train"][1] == 4 and held["serve"][1] == 6

        data = json.loads(_inspect(cluster, "-o", "json"))
        [shown] = [n for n in data["nodes"] if n["name"] == NODE]
        assert shown["mode"] == "share" and shown["seenFrom"] == "node"
        assert [g["totalUnits"] for g in shown["gpus"]] == [16, 16]
        pods = {p["name"]: p for p in shown["pods"]}
        assert set(pods) == {"train", "serve"}
        for name, (index, gib) in held.items():
            assert pods[name]["memUnits"] == {str(index): gib}
        per_gpu = [0, 0]
        for index, gib in held.values():
            per_gpu[index] += gib
        assert [g["allocatedUnits"] for g in shown["gpus"]] == per_gpu
        assert not [i for i in data["ignored"] if i["node"] == NODE]

        details = _inspect(cluster, "-d")
        assert f"NAME:       {NODE}" in details and "train" in details and "serve" in details
        assert "Allocated :  10 (31%)" in details.split(f"NAME:       {NODE}")[1]

        config = _tenant(cluster, tmp_path / "tenant.kubeconfig")
        tenant = json.loads(_inspect(cluster, "-o", "json", config=config))
        assert "resourceslices" in tenant["scope"]["forbidden"]
        [mine] = tenant["nodes"]
        assert mine["name"] == NODE and [p["name"] for p in mine["pods"]] == ["train"]
        assert mine["allocatedUnits"] == 4
        assert "Note: resourceslices: forbidden" in _inspect(cluster, config=config)
    finally:
        for namespace in (TEAM, OTHER):
            cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "resourceslice", published["metadata"]["name"], check=False)
        delete_nodes(cluster, [NODE])
