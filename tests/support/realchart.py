"""The chart installed on the real node: its values there, its components waited for, the seed
Jobs run through it, the API server relayed onto the pods' bridge. Shared by
``tests/e2e/test_helm.py``, ``test_helm_dra.py`` and ``test_platforms.py``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import GATEWAY, Cluster
from harness.image_archive import Builder, default_cache
from harness.ports import free_port
from harness.realnode import (
    BRIDGE,
    NODE_NAME,
    TEST_IMAGE,
    TOLERATION,
    RealNode,
    probe_env,
    unavailable,
)
from tests.support.e2e import REAL_NODE_LOCK, eventually, helm
from tests.support.realnode import NS as REAL_NS
from tests.support.realnode import PROBE_THEN, local_job, ns_pods, wait_done_label

REAL_RELEASE = "gpushare-real"
REAL_NAMESPACE = "gpushare-real"
WEBHOOK_LABEL = "gpushare.io/e2e-webhook"
COMPONENTS = ("scheduler", "webhook", "device-plugin")


def real_values(cluster: Cluster, node: RealNode, images: dict[str, str]) -> dict[str, Any]:
    """Values for the real node: local images never pulled, the node's own kubelet paths, the
    API server at its loopback address (no kube-proxy), fake GPUs, the taint tolerated."""
    on_node = {"kubernetes.io/hostname": node.name}
    tolerations = [TOLERATION]
    never = "Never"

    def image(tag: str) -> dict[str, str]:
        repository, _, version = tag.rpartition(":")
        return {"repository": repository, "tag": version, "pullPolicy": never}

    return {
        # the chart's default name, which the release recipe's image carries: never pulled
        "image": {"pullPolicy": never},
        "testing": {
            "apiServer": f"127.0.0.1:{cluster.ports['apiserver']}",
            "fakeGpus": node.fake_gpus,
        },
        "scheduler": {
            "replicas": 1,
            "image": image(images["kube-scheduler"]),
            # host network: ports nobody else on this machine holds
            "securePort": free_port(),
            "extender": {"port": free_port(), "metricsPort": 0},
            "nodeSelector": on_node,
            "tolerations": tolerations,
        },
        "devicePlugin": {
            "metricsPort": 0,
            # the chart's default, cdi-cri, against the fake GPUs' CDI spec (realnode.py)
            "deviceListStrategy": node.device_list_strategy,
            "cdi": {"specDirs": [str(node.cdi_dir)]},
            "tolerations": [*tolerations, {"key": "CriticalAddonsOnly", "operator": "Exists"}],
            "podResourcesPath": str(node.pod_resources_socket.parent),
            "kubeletConfigPath": str(node.kubelet_config),
            "cpuManagerStatePath": "",
            "stateHostPath": str(node.state_dir),
            # the start's hand-off check asks this node's containerd, not the host's
            "criSocketPath": str(node.containerd_socket),
        },
        "tests": {"gpuPod": {"nodeSelector": on_node, "tolerations": tolerations}},
        "isolation": {"libHostPath": str(node.lib_dir)},
        "webhook": {
            "replicas": 1,
            # only the walkthrough's namespace is checked and steered (Fail, the default)
            "namespaceLabels": {WEBHOOK_LABEL: REAL_NS},
            "nodeSelector": on_node,
            "tolerations": tolerations,
            "certs": {"job": {"image": image(images["webhook-certs"])}},
        },
    }


def helm_test_gpu_pod(cluster: Cluster) -> Any:
    """``helm test`` of the GPU pod alone, with its log; the pod is deleted afterwards, so it
    holds no memory for the unit guard's count."""
    pod = f"{REAL_RELEASE}-test-gpu-pod"
    try:
        return helm(
            cluster,
            "test",
            REAL_RELEASE,
            "-n",
            REAL_NAMESPACE,
            "--filter",
            f"name={pod}",
            "--logs",
            "--timeout",
            "180s",
            check=False,
        )
    finally:
        cluster.kubectl("delete", "pod", "-n", REAL_NAMESPACE, pod, "--wait=true", check=False)


def component_pods(cluster: Cluster) -> dict[str, list[dict[str, Any]]]:
    items = cluster.kubectl_json("get", "pods", "-n", REAL_NAMESPACE)["items"]
    out: dict[str, list[dict[str, Any]]] = {}
    for item in items:
        component = item["metadata"]["labels"].get("app.kubernetes.io/component", "")
        if item["metadata"].get("deletionTimestamp") is None:
            out.setdefault(component, []).append(item)
    return out


def pod_ready(item: dict[str, Any]) -> bool:
    conditions = item.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def why_not(cluster: Cluster) -> str:
    """Pod states and events of the workload namespace, then of the release namespace, and the
    extender's last log lines, for a failure message (the workload's come first: a CI excerpt
    keeps only so much)."""
    parts = []
    for namespace in (REAL_NS, REAL_NAMESPACE):
        pods = cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout
        events = cluster.kubectl(
            "get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False
        ).stdout
        parts.append(f"--- {namespace}\n{pods}\n{events[-3000:]}")
    logs = cluster.kubectl(
        "logs",
        "-n",
        REAL_NAMESPACE,
        "-l",
        "app.kubernetes.io/component=scheduler",
        "-c",
        "extender",
        "--tail=30",
        check=False,
    )
    parts.append(f"--- extender log\n{logs.stdout[-3000:]}{logs.stderr[-500:]}")
    jobs = cluster.kubectl(
        "logs", "-n", REAL_NAMESPACE, "-l", "app.kubernetes.io/component in (seal,webhook-certs)",
        "--tail=15", "--prefix", check=False,
    )  # fmt: skip
    parts.append(f"--- the Jobs' logs\n{jobs.stdout[-3000:]}{jobs.stderr[-500:]}")
    return "\n".join(parts)


def wait_components(
    cluster: Cluster, what: str, timeout: float = 240, components: tuple[str, ...] = COMPONENTS
) -> None:
    """Every component's pods Ready (one each), the cert Job complete; ``components``: the
    ones the values run (DRA mode's driver in place of the device plugin on a DRA node)."""

    def ready() -> bool:
        pods = component_pods(cluster)
        if not all(pods.get(c) and all(pod_ready(p) for p in pods[c]) for c in components):
            return False
        jobs = cluster.kubectl_json("get", "jobs", "-n", REAL_NAMESPACE)["items"]
        return bool(jobs) and all(j.get("status", {}).get("succeeded") for j in jobs)

    try:
        eventually(ready, timeout, what)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{why_not(cluster)}") from None


def allocatable(node: RealNode) -> dict[str, str]:
    status: dict[str, str] = node.node().get("status", {}).get("allocatable", {})
    return status


def steered_job(cluster: Cluster, name: str) -> dict[str, str]:
    """Run the seed Job ``examples/<name>.yaml`` (it names no scheduler) to completion with the
    probe as its command; check the chart's webhook steered it to ack-co-scheduler; delete it
    and return the environment the probe saw."""
    job = local_job(f"{name}.yaml", command=["/bin/sh", "-c", PROBE_THEN + "sleep 2"])
    cluster.kubectl("apply", "-f", "-", input=json.dumps(job))
    try:
        items = wait_done_label(cluster, f"job-name={name}")
    except AssertionError as err:
        raise AssertionError(f"{err}\n{why_not(cluster)}") from None
    assert items[0]["spec"]["schedulerName"] == "ack-co-scheduler"
    env = probe_env(cluster.kubectl("logs", "-n", REAL_NS, items[0]["metadata"]["name"]).stdout)
    cluster.kubectl("delete", "job", "-n", REAL_NS, name, "--wait=true")

    def gone() -> bool:
        pods = ns_pods(cluster, REAL_NS)
        return not [p for p in pods if p["metadata"].get("labels", {}).get("job-name") == name]

    eventually(gone, 90, f"{name} pod gone")
    return env


def restart_device_plugin(cluster: Cluster) -> None:
    """Delete the DaemonSet's pod (the plugin reads the node's mode at start) and wait for the
    new one to be Ready."""
    old = {p["metadata"]["uid"] for p in component_pods(cluster).get("device-plugin", [])}
    cluster.kubectl(
        "delete", "pods", "-n", REAL_NAMESPACE, "-l", "app.kubernetes.io/component=device-plugin"
    )

    def replaced() -> bool:
        pods = component_pods(cluster).get("device-plugin", [])
        return bool(pods) and all(p["metadata"]["uid"] not in old and pod_ready(p) for p in pods)

    eventually(replaced, 120, "a new device-plugin pod Ready")


def chart_node(
    cluster: Cluster, make: Callable[[Path], RealNode] | None = None
) -> Iterator[tuple[RealNode, dict[str, str]]]:
    """For a fixture: the real node (``make(root)``, a plain :class:`RealNode` by default)
    without a device-plugin process (the chart's DaemonSet brings one), the
    chart's images imported into its containerd, and the control plane's own kube-scheduler
    serving only ``default-scheduler`` (as a cluster's would), so ``ack-co-scheduler`` is the
    chart's alone. Everything is put back afterwards for the tests that follow."""
    reason = unavailable()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"real node unavailable in CI: {reason}")
        pytest.skip(f"real node unavailable: {reason}")
    if shutil.which("mmdebstrap") is None and os.environ.get("CI") != "true":
        pytest.skip("mmdebstrap is not installed (apt-get install -y mmdebstrap)")
    started = time.monotonic()
    builder = Builder(cache=default_cache(), binaries=cluster.binaries, progress=True)
    built = {
        "gpushare": builder.gpushare(),
        "kube-scheduler": builder.kube_scheduler(),
        "webhook-certs": builder.webhook_certs(),
    }
    print(f"[e2e] chart images ready in {time.monotonic() - started:.1f}s", flush=True)
    with open(REAL_NODE_LOCK, "w") as lock:
        # one kubelet per machine, as conftest's real_node: wait for another session's to go
        waited = time.monotonic()
        fcntl.flock(lock, fcntl.LOCK_EX)
        print(f"[e2e] waited {time.monotonic() - waited:.0f}s for the real node", flush=True)
        root = cluster.root / "realnode"
        node = (
            make(root)
            if make is not None
            else RealNode(cluster=cluster, root=root, plugin=False, gateway=True)
        )
        saved_settings = dict(cluster.scheduler_settings)
        try:
            node.start(progress=lambda s: print(f"[e2e] starting {s}", flush=True))
            for _, archive in built.values():
                node.ctr("images", "import", str(archive), timeout=300)
            cluster.processes["gpushare-extender"].stop()
            cluster.scheduler_settings = {
                **saved_settings,
                "profiles": [{"schedulerName": "default-scheduler"}],
                "extenders": [],
            }
            cluster.restart_scheduler()
            print(f"[e2e] real node for helm up in {time.monotonic() - started:.1f}s", flush=True)
            yield node, {name: tag for name, (tag, _) in built.items()}
        finally:
            node.stop()
            cluster.scheduler_settings = saved_settings
            cluster.restart_scheduler()
            cluster.start_extender(unit="1GiB")


def _bridge_has_gateway() -> bool:
    shown = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "dev", BRIDGE], capture_output=True, text=True
    )
    return f" {GATEWAY}/" in shown.stdout


def open_bridge(cluster: Cluster, namespace: str) -> None:
    """Make sure the pods' bridge exists with this machine's address on it (CNI creates it for
    the first pod on the pod network): run one short pod there when it does not yet."""
    if _bridge_has_gateway():
        return
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "open-bridge", "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE_NAME},
            "tolerations": [TOLERATION],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "main",
                    "image": TEST_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", "true"],
                }
            ],
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
    eventually(_bridge_has_gateway, 60, f"{GATEWAY} on {BRIDGE}")
    cluster.kubectl("delete", "pod", "-n", namespace, "open-bridge", "--wait=false")


@contextlib.contextmanager
def api_relay(cluster: Cluster) -> Iterator[str]:
    """``GATEWAY:<port>``, relayed byte for byte to the API server on the loopback, for values'
    ``testing.apiServer`` when a pod on the pod network calls the API server (DRA mode's
    webhook creates claim templates; it stays on the pod network because its Service must
    route to it, and a host-network pod's address here is the loopback, which an EndpointSlice
    refuses). TLS passes through: the API server's certificate names ``GATEWAY``. Needs the
    bridge (:func:`open_bridge`)."""
    upstream = ("127.0.0.1", cluster.ports["apiserver"])
    server = socket.create_server((GATEWAY, 0))
    server.settimeout(0.5)
    stopping = threading.Event()
    open_sockets: list[socket.socket] = []

    def pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def serve() -> None:
        while not stopping.is_set():
            try:
                client, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                backend = socket.create_connection(upstream, timeout=5)
            except OSError:
                client.close()
                continue
            backend.settimeout(None)
            client.settimeout(None)
            open_sockets.extend((client, backend))
            for a, b in ((client, backend), (backend, client)):
                threading.Thread(target=pump, args=(a, b), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"{GATEWAY}:{server.getsockname()[1]}"
    finally:
        stopping.set()
        thread.join(timeout=5)
        server.close()
        for sock in open_sockets:
            with contextlib.suppress(OSError):
                sock.close()
