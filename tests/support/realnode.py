"""Pods on the real node (containerd, kubelet, the device plugin): created, waited for, read,
and compared with what the scheduler booked; the ``ns`` fixture (a fresh namespace a test).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from harness.cluster import Cluster
from harness.images import TEST_IMAGE
from harness.realnode import NODE_NAME, TOLERATION, RealNode, hand_off, probe_env
from tests.support.e2e import REPO, eventually

NS = "e2e-real"


MiB = 2**20


def statuses(item: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every container status of a pod (init containers included), by container name."""
    status = item.get("status", {})
    out = {}
    for key in ("initContainerStatuses", "containerStatuses"):
        for entry in status.get(key) or []:
            out[entry["name"]] = entry
    return out


def probed(entry: dict[str, Any]) -> dict[str, str] | None:
    """What /probe printed in a container, from its termination message, if it has one."""
    for state in ("terminated", "running"):
        terminated = (entry.get("state", {}).get(state) or {}).get("message")
        if terminated:
            return probe_env(terminated)
    last = (entry.get("lastState", {}).get("terminated") or {}).get("message")
    return probe_env(last) if last else None


def expected(
    item: dict[str, Any], name: str, uuids: dict[int, str], strategy: str
) -> dict[str, str]:
    """The variables (and, read back from inside, device nodes) a container must have, from its
    pod's allocation record and the plugin's device-list strategy."""
    record = json.loads(item["metadata"]["annotations"]["gpushare.io/allocation"])
    entry = next((c for c in record["containers"] if c["name"] == name), None)
    if entry is None:
        return {}
    gpus = [g for g in entry["gpus"] if g["mem"] or g["core"]]
    out = {
        "ALIYUN_COM_GPU_MEM_IDX": ",".join(str(g["index"]) for g in gpus),
        "ALIYUN_COM_GPU_MEM_POD": str(sum(g["mem"] for g in record["gpus"])),
        **hand_off([g["index"] for g in gpus], uuids, strategy),
    }
    mem = [g for g in gpus if g["mem"]]
    if mem:
        out["ALIYUN_COM_GPU_MEM_CONTAINER"] = str(sum(g["mem"] for g in mem))
        out["GPUSHARE_MEM_PER_GPU"] = ",".join(f"{g['index']}:{g['mem']}" for g in mem)
    cores = [g for g in gpus if g["core"]]
    if cores:
        out["ALIYUN_COM_GPU_CORE_PERCENTAGE"] = str(max(g["core"] for g in cores))
    return out


def gpu_uuids(cluster: Cluster, node: str = NODE_NAME) -> dict[int, str]:
    annotations = cluster.kubectl_json("get", "node", node)["metadata"]["annotations"]
    return {g["index"]: g["uuid"] for g in json.loads(annotations["gpushare.io/gpus"])}


def gpu_containers(item: dict[str, Any]) -> list[str]:
    """Names of the pod's containers that ask for GPU memory or computing power."""
    spec = item["spec"]
    names = []
    for c in [*(spec.get("initContainers") or []), *spec["containers"]]:
        limits = c.get("resources", {}).get("limits", {})
        if "aliyun.com/gpu-mem" in limits or "aliyun.com/gpu-core.percentage" in limits:
            names.append(c["name"])
    return names


def compare(
    items: list[dict[str, Any]], uuids: dict[int, str], strategy: str
) -> tuple[int, list[str], dict[str, dict[str, str]]]:
    """(containers checked, mismatches, env by pod/container) for pods whose containers ran."""
    checked, mismatches, seen = 0, [], {}
    for item in items:
        states = statuses(item)
        for name in gpu_containers(item):
            got = probed(states.get(name, {}))
            if got is None:
                continue
            key = f"{item['metadata']['name']}/{name}"
            seen[key] = got
            want = expected(item, name, uuids, strategy)
            checked += 1
            wrong = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
            if wrong:
                mismatches.append(f"{key}: {wrong}")
    return checked, mismatches, seen


def ns_pods(cluster: Cluster, namespace: str = NS) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.kubectl_json("get", "pods", "-n", namespace)["items"]
    return items


def create(cluster: Cluster, manifests: list[dict[str, Any]]) -> None:
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests})
    cluster.kubectl("create", "-f", "-", input=body, timeout=300)


def wait_done(cluster: Cluster, names: set[str], timeout: float = 180) -> list[dict[str, Any]]:
    """Until every named pod has Succeeded; fail with the others' phase and last event."""

    def done() -> list[dict[str, Any]] | None:
        items = [p for p in ns_pods(cluster) if p["metadata"]["name"] in names]
        if len(items) == len(names) and all(p["status"].get("phase") == "Succeeded" for p in items):
            return items
        return None

    try:
        result: list[dict[str, Any]] = eventually(done, timeout, f"{len(names)} pods Succeeded")
    except AssertionError:
        lines = []
        for p in ns_pods(cluster):
            if p["metadata"]["name"] in names and p["status"].get("phase") != "Succeeded":
                lines.append(f"{p['metadata']['name']}: {p['status'].get('phase')} {reasons(p)}")
        raise AssertionError("pods not Succeeded:\n" + "\n".join(lines)) from None
    return result


def reasons(item: dict[str, Any]) -> str:
    """Why a pod is where it is: its conditions, its own reason, and each container that
    ended or waits with a reason (a pod failed by a containerd restart says so only there)."""
    status = item.get("status", {})
    parts = [f"{c.get('reason')}: {c.get('message')}" for c in status.get("conditions") or []]
    if status.get("message"):
        parts.append(f"{status.get('reason')}: {status['message']}")
    for kind in ("initContainerStatuses", "containerStatuses"):
        for entry in status.get(kind) or []:
            state = entry.get("state") or {}
            last = (entry.get("lastState") or {}).get("terminated")
            ended = state.get("terminated") or last
            waiting = state.get("waiting")
            if ended and (ended.get("exitCode") or ended.get("reason") != "Completed"):
                message = (ended.get("message") or "").strip()[:160]
                parts.append(
                    f"{entry.get('name')} {ended.get('reason')} exit {ended.get('exitCode')}"
                    + (f": {message}" if message else "")
                )
            elif waiting and waiting.get("reason"):
                message = (waiting.get("message") or "").strip()[:160]
                parts.append(
                    f"{entry.get('name')} {waiting['reason']}" + (f": {message}" if message else "")
                )
    return "; ".join(p for p in parts if "None: None" not in p)


def served(item: dict[str, Any]) -> bool:
    return (item["metadata"].get("annotations") or {}).get("ALIYUN_COM_GPU_MEM_ASSIGNED") == "true"


def fresh_namespace(cluster: Cluster) -> None:
    cluster.kubectl("delete", "namespace", NS, "--ignore-not-found", "--wait=true", timeout=180)
    cluster.create_namespace(NS)


def local_job(path: str, *, command: list[str]) -> dict[str, Any]:
    """A seed manifest with the local image, its command replaced by the probe, on this node."""
    manifest: dict[str, Any] = yaml.safe_load((REPO / "examples" / path).read_text())
    spec = manifest["spec"]["template"]["spec"]
    spec["nodeSelector"] = {"kubernetes.io/hostname": NODE_NAME}
    spec["tolerations"] = [TOLERATION]
    spec["terminationGracePeriodSeconds"] = 1
    for c in spec["containers"]:
        c.update(image=TEST_IMAGE, imagePullPolicy="Never", command=command, workingDir="/")
        c.pop("args", None)
    manifest["metadata"]["namespace"] = NS
    return manifest


PROBE_THEN = "/probe; /probe > /dev/termination-log; "


@pytest.fixture
def ns(real_node: RealNode) -> Iterator[str]:
    """A fresh namespace for the test's pods, deleted (and waited for) afterwards, so the next
    test starts on a node that holds no GPU memory."""
    fresh_namespace(real_node.cluster)
    yield NS
    real_node.cluster.kubectl(
        "delete", "namespace", NS, "--ignore-not-found", "--wait=true", timeout=300, check=False
    )


def logged(cluster: Cluster, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods with each GPU container's /probe output from ``kubectl logs`` put where
    :func:`compare` reads it (for containers still running)."""
    out = []
    for item in items:
        copy = json.loads(json.dumps(item))
        for entry in statuses(copy).values():
            if entry["name"] in gpu_containers(copy) and not probed(entry):
                text = cluster.kubectl(
                    "logs", "-n", NS, copy["metadata"]["name"], "-c", entry["name"]
                ).stdout
                entry.setdefault("state", {})["terminated"] = {"message": text}
        out.append(copy)
    return out


def wait_done_label(cluster: Cluster, selector: str, timeout: float = 120) -> list[dict[str, Any]]:
    def done() -> list[dict[str, Any]] | None:
        items: list[dict[str, Any]] = cluster.kubectl_json("get", "pods", "-n", NS, "-l", selector)[
            "items"
        ]
        ok = [p for p in items if p["status"].get("phase") == "Succeeded"]
        if ok:
            return ok
        failed = [p for p in items if p["status"].get("phase") == "Failed"]
        assert not failed, [reasons(p) for p in failed]
        return None

    result: list[dict[str, Any]] = eventually(done, timeout, f"{selector} Succeeded")
    return result
