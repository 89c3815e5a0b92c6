"""GPU by GPU with the real cluster-autoscaler: the fragmentation trap, the estimate, scale-down.

cluster-autoscaler 1.36.1 (kwok provider) runs beside the loopback control plane, kube-scheduler's
``ack-co-scheduler`` profile and gpushare's extender, run with the chart's identity and its
autoscaling flags (placeholders in the release namespace, the scale-down guard). Facts about the
autoscaler (it judges aliyun.com/gpu-mem by node totals and never asks the extender: the
fragmentation trap; its estimator packs by totals; its scale-down re-places pods by totals and
judges a node without a vendor GPU resource by CPU and memory) are in
../shared/docs/AUTOSCALERS.md 1a and 1d, with the autoscaler's source files.

Each test that shows a fix has a twin with the fix off that shows the autoscaler's own
behaviour, so the harness is known to reproduce what the fix is for.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpushare.core.autoscaling.placeholders import PLACEHOLDER_LABEL
from gpushare.core.autoscaling.scaledown import ANN_GUARD, CA_SCALE_DOWN_DISABLED
from gpushare.core.model.startuptaint import STARTUP_TAINT
from gpushare.kube.lightkube_api import LightkubeAPI
from gpushare.node.startuptaint import release_once
from harness.autoscalers import (
    GROUP_LABEL,
    KARPENTER_BINARY,
    SCALE_DOWN_AT_ONCE,
    GpuShape,
    gpu_instance_type,
    gpu_template,
    group_node_names,
    node_agent_patch,
    node_of_group,
    nodepool,
    publishing_gpus,
    running_cluster_autoscaler,
    running_karpenter,
    unavailable,
    wait_bound,
    wait_group_size,
)
from harness.cluster import Cluster, wait_for
from harness.helpers import apply_all, gpu_pod_manifest, pods
from harness.identities import NAMESPACE, device_plugin_kubeconfig
from tests.support.e2e import cluster_autoscaler_binaries, create_nodes

BIG = GpuShape(gpus=4, gib=16)
PUBLISHED = ("gpushare.io/gpus", "gpushare.io/gpu-mem-unit")
"""What the device plugin publishes on its node with the GPUs (``node.publishing``)."""
AUTOSCALING = (
    "--placeholder-namespace",
    NAMESPACE,
    "--scale-down-guard",
    "--autoscaling-period",
    "1",
)
"""The chart's defaults (``autoscaling.placeholders``, ``autoscaling.scaleDownGuard``) as the
extender's flags, with a round a second for the test."""
SCALE_DOWN = (
    *SCALE_DOWN_AT_ONCE,
    "--scale-down-utilization-threshold=0.5",
)


@pytest.fixture(scope="module")
def autoscalers() -> dict[str, Path]:
    return cluster_autoscaler_binaries()


@pytest.fixture(params=["fix", "off"])
def fix(request: pytest.FixtureRequest, cluster: Cluster) -> Iterator[bool]:
    """The extender with its autoscaling flags (the chart's default) or without them."""
    on = request.param == "fix"
    cluster.start_extender(extra=AUTOSCALING if on else ())
    yield on
    cluster.start_extender(extra=())


@dataclass(frozen=True)
class _Case:
    """One test's names: its namespace (the tag), its 4 x 16 GiB group and the pods' selector."""

    tag: str
    group: str
    select: dict[str, str]

    @property
    def ns(self) -> str:
        return self.tag


def _case(cluster: Cluster, name: str, fix: bool) -> _Case:
    tag = f"{name}-{'fix' if fix else 'off'}"
    cluster.create_namespace(tag, check=False)
    return _Case(tag, f"{tag}-4x16", {"gpushare-e2e": tag})


def _placeholders(cluster: Cluster) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.kubectl_json(
        "get", "pods", "-n", NAMESPACE, "-l", f"{PLACEHOLDER_LABEL}=true"
    )["items"]
    return items


def _bound(cluster: Cluster, ns: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["spec"].get("nodeName") or "" for p in pods(cluster, ns)}


def _warm(cluster: Cluster, template: dict[str, Any], name: str) -> str:
    node = node_of_group(template, name)
    node["metadata"]["labels"]["kubernetes.io/hostname"] = name
    create_nodes(cluster, [node])
    return name


def _fill(cluster: Cluster, ns: str, select: dict[str, str], node: str, sizes: list[int]) -> None:
    """Pods of ``sizes`` GiB that land on ``node`` (the only one with room), evictable by the
    autoscaler."""
    manifests = []
    for i, size in enumerate(sizes):
        pod = gpu_pod_manifest(f"{node}-{i}", ns, size, selector=select)
        pod["metadata"]["annotations"] = {"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"}
        manifests.append(pod)
    apply_all(cluster, manifests)
    for pod in manifests:
        assert wait_bound(cluster, ns, pod["metadata"]["name"], 60) == node


def test_the_fragmentation_trap(cluster: Cluster, autoscalers: dict[str, Path], fix: bool) -> None:
    """Four GPUs with 3 GiB free each (12 GiB by the node's totals) and a pod asking 8 GiB.
    Off: cluster-autoscaler finds the pod a place on the full node and adds nothing (the pod
    waits for ever). Fix: one placeholder; one node added; the pod bound there; the
    placeholder gone; the count put for 5 loops."""
    case = _case(cluster, "trap", fix)
    tag, group, select, ns = case.tag, case.group, case.select, case.ns
    template = gpu_template(group, BIG, labels=select)
    warm = _warm(cluster, template, f"{group}-warm0")
    try:
        _fill(cluster, ns, select, warm, [13] * 4)
        with (
            running_cluster_autoscaler(cluster, autoscalers, [template], name=f"ca-{tag}") as ca,
            publishing_gpus(cluster, {group: BIG}),
        ):
            apply_all(cluster, [gpu_pod_manifest("ask", ns, 8, selector=select)])
            try:
                if not fix:
                    ca.wait_loops(10, timeout=90)
                    assert ca.scale_ups() == []
                    assert group_node_names(cluster, group) == [warm]
                    assert not _bound(cluster, ns)["ask"]
                    # the autoscaler's reason: the pod "fits" the full node by its totals
                    assert ca.log_lines("ask.*(can be moved to|marked as schedulable|schedulable)")
                    return
                nodes = wait_group_size(cluster, group, 2, 90, ca.process)
                added = [n["metadata"]["name"] for n in nodes if n["metadata"]["name"] != warm]
                landed = wait_bound(cluster, ns, "ask", 90, ca.process)
                assert landed == added[0]
                wait_for("the placeholder gone", lambda: not _placeholders(cluster), 30)
                ca.wait_loops(5)
                assert group_node_names(cluster, group) == [warm, *added]
                assert ca.scale_ups() == [(group, 2)]
            except BaseException:
                print(f"--- {ca.process.name} log tail ---\n{ca.tail(80)}")
                raise
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        cluster.kubectl("delete", "node", warm, "--wait=false", check=False)


def test_the_estimate_is_gpu_by_gpu(
    cluster: Cluster, autoscalers: dict[str, Path], fix: bool
) -> None:
    """5 pods of 10 GiB from zero, template 4 x 16 GiB: by totals one node holds 6, GPU by GPU
    4, so they need 2 nodes. Off: 1 node, and the fifth pod waits for ever (it fits the node by
    totals). Fix: 2 nodes, every pod bound, the count put for 5 loops."""
    case = _case(cluster, "est", fix)
    tag, group, select, ns = case.tag, case.group, case.select, case.ns
    template = gpu_template(group, BIG, labels=select)
    try:
        with (
            running_cluster_autoscaler(cluster, autoscalers, [template], name=f"ca-{tag}") as ca,
            publishing_gpus(cluster, {group: BIG}),
        ):
            apply_all(
                cluster, [gpu_pod_manifest(f"p{i}", ns, 10, selector=select) for i in range(5)]
            )
            try:
                if not fix:
                    wait_group_size(cluster, group, 1, 90, ca.process)
                    wait_for(
                        "4 pods bound",
                        lambda: sum(bool(n) for n in _bound(cluster, ns).values()) == 4,
                        60,
                    )
                    ca.wait_loops(10, timeout=90)
                    assert len(group_node_names(cluster, group)) == 1
                    assert sum(bool(n) for n in _bound(cluster, ns).values()) == 4
                    return
                wait_group_size(cluster, group, 2, 120, ca.process)
                wait_for(
                    "5 pods bound",
                    lambda: all(_bound(cluster, ns).values()),
                    90,
                    ca.process,
                )
                wait_for("no placeholder", lambda: not _placeholders(cluster), 30)
                ca.wait_loops(5)
                assert len(group_node_names(cluster, group)) == 2
                print("scale-ups:", ca.scale_ups())
            except BaseException:
                print(f"--- {ca.process.name} log tail ---\n{ca.tail(80)}")
                raise
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_scale_down(cluster: Cluster, autoscalers: dict[str, Path], fix: bool) -> None:
    """Node b holds four 11 GiB pods (69 % of its GPU memory), node a two 9 GiB pods (28 %),
    both idle by CPU. Off: cluster-autoscaler judges both by CPU and memory (0 %) and removes
    one: b, its pods moved to a by totals (46 GiB free) where GPU by GPU only two fit (a's
    GPUs have 7, 7, 16 and 16 GiB free), or a, its pods moved to b by totals (20 GiB free)
    where none fits (5 GiB a GPU). Fix: both stay (b's GPUs are used; a's pods fit nowhere else GPU
    by GPU: b has 5 GiB a GPU); once a's pods are gone, a (empty) is removed and b stays."""
    case = _case(cluster, "down", fix)
    tag, group, select, ns = case.tag, case.group, case.select, case.ns
    template = gpu_template(group, BIG, labels=select)
    a, b = f"{group}-a", f"{group}-b"
    try:
        # b first, alone: four 11 GiB pods; then a: 9 GiB pods fit only there. Nothing pins a
        # pod to its node, so the autoscaler may move any of them as it sees fit
        _warm(cluster, template, b)
        _fill(cluster, ns, select, b, [11] * 4)
        _warm(cluster, template, a)
        _fill(cluster, ns, select, a, [9, 9])
        if fix:
            wait_for(
                "both nodes guarded",
                lambda: all(
                    ANN_GUARD
                    in (cluster.kubectl_json("get", "node", n)["metadata"].get("annotations") or {})
                    for n in (a, b)
                ),
                30,
            )
        with running_cluster_autoscaler(
            cluster, autoscalers, [template], name=f"ca-{tag}", flags=SCALE_DOWN
        ) as ca:
            try:
                if not fix:
                    # it takes b (GPUs full, CPU idle: "0 %"), its four 11 GiB pods moved to a
                    # by totals (46 GiB free) where GPU by GPU two fit, or a, its two 9 GiB pods
                    # moved to b by totals (20 GiB free) where GPU by GPU none does
                    wait_for(
                        "a node removed",
                        lambda: len(group_node_names(cluster, group)) < 2,
                        120,
                        ca.process,
                    )
                    (kept,) = group_node_names(cluster, group)
                    gone = b if kept == a else a
                    # either way its pods went by totals where GPU by GPU they do not fit
                    assert ca.log_lines(f"Pod {ns}/{gone}-0 can be moved to {kept}")
                    return
                ca.wait_loops(15, timeout=120)  # well past the 5 s unneeded time
                assert sorted(group_node_names(cluster, group)) == [a, b]
                assert all(_bound(cluster, ns).values())
                annotations = cluster.kubectl_json("get", "node", a)["metadata"]["annotations"]
                assert annotations[CA_SCALE_DOWN_DISABLED] == "true"
                cluster.kubectl("delete", "pod", "-n", ns, f"{a}-0", f"{a}-1")
                wait_for(
                    "node a (empty) removed",
                    lambda: a not in group_node_names(cluster, group),
                    120,
                    ca.process,
                )
                ca.wait_loops(5)
                assert group_node_names(cluster, group) == [b]
            except BaseException:
                print(f"--- {ca.process.name} log tail ---\n{ca.tail(80)}")
                raise
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        cluster.kubectl("delete", "node", a, b, "--wait=false", "--ignore-not-found", check=False)


async def _release(config: str, node: str) -> None:
    """The device plugin's own removal of the startup taint, as the node's plugin."""
    api = LightkubeAPI.connect(config)
    try:
        await release_once(api, node, key=STARTUP_TAINT, resource="aliyun.com/gpu-mem")
    finally:
        await api.close()


class _Kubelet:
    """Kubelet before gpushare's device plugin registered, on the group's new nodes: at first
    sight the node's status holds no gpu-mem and gpu-count (kubelet reports only what a
    registered plugin advertises); ``delay_s`` later the plugin registers (kubelet reports them)
    and the plugin's own code (``node.startuptaint.release_once``, as the node's device plugin,
    with the chart's identity) removes the startup taint."""

    def __init__(self, cluster: Cluster, group: str, delay_s: float) -> None:
        self.cluster, self.group, self.delay_s = cluster, group, delay_s
        self.seen: dict[str, float] = {}
        self.registered: set[str] = set()
        self.released: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> _Kubelet:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _status(self, name: str, resources: dict[str, str] | None) -> None:
        ops: list[dict[str, Any]] = []
        for field in ("capacity", "allocatable"):
            for resource in ("aliyun.com~1gpu-mem", "aliyun.com~1gpu-count"):
                path = f"/status/{field}/{resource}"
                if resources is None:
                    ops.append({"op": "remove", "path": path})
                else:
                    key = resource.replace("~1", "/")
                    ops.append({"op": "add", "path": path, "value": resources[key]})
        self.cluster.kubectl(
            "patch",
            "node",
            name,
            "--subresource=status",
            "--type=json",
            "-p",
            json.dumps(ops),
            check=False,
        )

    def _loop(self) -> None:
        while not self._stop.wait(0.3):
            try:
                items = self.cluster.kubectl_json(
                    "get", "nodes", "-l", f"{GROUP_LABEL}={self.group}"
                )["items"]
            except Exception:
                continue
            for node in items:
                name = node["metadata"]["name"]
                if name not in self.seen:
                    self.seen[name] = time.monotonic()
                    self._status(name, None)
                elif (
                    name not in self.registered
                    and time.monotonic() - self.seen[name] >= self.delay_s
                ):
                    counts = {
                        "aliyun.com/gpu-mem": str(BIG.gpu_mem),
                        "aliyun.com/gpu-count": str(BIG.gpus),
                    }
                    self._status(name, counts)
                    patch = node_agent_patch(node, BIG)
                    if patch:
                        self.cluster.kubectl(
                            "patch",
                            "node",
                            name,
                            "--type=merge",
                            "-p",
                            json.dumps(patch),
                            check=False,
                        )
                    self.registered.add(name)
                elif name in self.registered and name not in self.released:
                    config = str(device_plugin_kubeconfig(self.cluster, name))

                    try:
                        asyncio.run(_release(config, name))
                        self.released.add(name)
                    except Exception:
                        pass


def test_a_node_that_registers_before_its_device_plugin_adds_no_second_node(
    cluster: Cluster, autoscalers: dict[str, Path], fix: bool
) -> None:
    """A new node is Ready 25 s before its device plugin registers (no gpu-mem yet). Off (no
    startup taint): cluster-autoscaler takes that Ready node as its group's template
    (``processors/nodeinfosprovider``: a real node of the group before the provider's
    template), which has no gpu-mem, so no pod gets a node of the group ("NotTriggerScaleUp:
    Insufficient aliyun.com/gpu-mem") until the plugin registers. Fix (the pool's nodes
    register with gpushare's startup taint, which the device plugin removes once kubelet
    allocates gpu-mem): the node counts as starting, in the simulation as a template node that
    holds the pod (``utils/taints``, ``clusterstate``); one scale-up, the pod bound there, the
    count put for 5 loops."""
    case = _case(cluster, "late", fix)
    tag, group, select, ns = case.tag, case.group, case.select, case.ns
    taints = [{"key": STARTUP_TAINT, "effect": "PreferNoSchedule"}] if fix else []
    template = gpu_template(group, BIG, labels=select, taints=taints)
    for key in PUBLISHED:  # a node group's template declares resources, never the inventory
        template["metadata"]["annotations"].pop(key)
    try:
        with (
            running_cluster_autoscaler(cluster, autoscalers, [template], name=f"ca-{tag}") as ca,
            _Kubelet(cluster, group, delay_s=25) as kubelet,
        ):
            apply_all(cluster, [gpu_pod_manifest("ask", ns, 8, selector=select)])
            try:
                wait_group_size(cluster, group, 1, 60, ca.process)
                blind = "Insufficient aliyun.com/gpu-mem.*template-node-for-" + group
                if not fix:
                    # the Ready node without gpu-mem becomes the group's template: the
                    # autoscaler can add no node of the group for any pod until it registers
                    wait_for("a template without gpu-mem", lambda: bool(ca.log_lines(blind)), 25)
                    assert not _bound(cluster, ns)["ask"]
                    return
                landed = wait_bound(cluster, ns, "ask", 90, ca.process)
                assert not ca.log_lines(blind)
                wait_for("the startup taint released", lambda: kubelet.released == {landed}, 30)
                ca.wait_loops(5)
                assert group_node_names(cluster, group) == [landed]
                assert ca.scale_ups() == [(group, 1)]
            except BaseException:
                print(f"--- {ca.process.name} log tail ---\n{ca.tail(80)}")
                raise
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_the_fragmentation_trap_with_karpenter(
    cluster: Cluster, autoscalers: dict[str, Path], fix: bool
) -> None:
    """The trap with Karpenter v1.15.0: it packs by the node's totals too. Four 13 GiB pods get
    one 4 x 16 GiB node; an 8 GiB pod then "fits" it by its 12 GiB free. Off: no NodeClaim.
    Fix (``autoscaling.autoscaler: karpenter``: placeholders keep off published nodes by the
    ``gpushare.io/gpus-published`` label, since Karpenter ignores pods naming the hostname or
    using ``matchFields``): one more node, the pod bound there."""
    reason = unavailable(autoscalers, KARPENTER_BINARY)
    if reason:
        pytest.skip(reason)
    if fix:
        cluster.start_extender(extra=(*AUTOSCALING, "--placeholder-exclusion", "label"))
    case = _case(cluster, "kptrap", fix)
    tag, group, select, ns = case.tag, case.group, case.select, case.ns
    try:
        with (
            running_karpenter(
                cluster,
                autoscalers,
                [gpu_instance_type(group, BIG)],
                [nodepool(group, [group], labels=select)],
                name=f"karpenter-{tag}",
            ) as karpenter,
            publishing_gpus(cluster, {group: BIG}),
        ):
            try:
                apply_all(
                    cluster,
                    [gpu_pod_manifest(f"fill{i}", ns, 13, selector=select) for i in range(4)],
                )
                (first,) = [n["metadata"]["name"] for n in wait_group_size(cluster, group, 1, 90)]
                for i in range(4):
                    assert wait_bound(cluster, ns, f"fill{i}", 60) == first
                apply_all(cluster, [gpu_pod_manifest("ask", ns, 8, selector=select)])
                if not fix:
                    time.sleep(20)  # many batching windows
                    assert group_node_names(cluster, group) == [first]
                    assert not _bound(cluster, ns)["ask"]
                    return
                nodes = wait_group_size(cluster, group, 2, 90, karpenter.process)
                added = [n["metadata"]["name"] for n in nodes if n["metadata"]["name"] != first]
                assert wait_bound(cluster, ns, "ask", 90, karpenter.process) == added[0]
                wait_for("the placeholder gone", lambda: not _placeholders(cluster), 30)
                time.sleep(10)
                assert len(group_node_names(cluster, group)) == 2
            except BaseException:
                print(f"--- {karpenter.process.name} log tail ---\n{karpenter.tail(80)}")
                raise
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
