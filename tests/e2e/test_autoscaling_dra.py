"""DRA mode with the real cluster-autoscaler: the fragmentation trap is gone, GPU by GPU.

In device-plugin mode cluster-autoscaler judges ``aliyun.com/gpu-mem`` by a node's totals and
never asks the extender, so a pod that fits no single GPU of a node whose sum would hold it
waits for ever (tests/e2e/test_autoscaling_gpu.py, ``test_the_fragmentation_trap``). In DRA mode
(docs/dra.md) each GPU is a device with consumable ``memory``, and cluster-autoscaler 1.36.1 runs
the scheduler's own DRA allocator in its simulation, tracking the capacity each allocated claim
consumes (``simulator/dynamicresources/snapshot/snapshot_claim_tracker.go``
``GatherAllocatedState``, with ``DRAConsumableCapacity``, beta and on by default in
k8s.io/kubernetes v1.36.2, the gates cluster-autoscaler registers). Nothing of gpushare's runs in
the decision: kube-apiserver, kube-controller-manager (it makes each pod's claim from its
template), kube-scheduler v1.36.3 with the stock allocator, and cluster-autoscaler 1.36.1 with
its kwok provider. The nodes' ResourceSlices are ``core.dra.slices.build_slice``'s, published as
the driver would (``harness/dra.py``: a kwok node has no kubelet for the driver).

What cluster-autoscaler needs: a node group whose template carries the slices. Its template for
a group comes first from a ready node of the group, copied with that node's slices
(``processors/nodeinfosprovider/mixed_nodeinfos_processor.go``, ``simulator/node_info_utils.go``
``SanitizedTemplateNodeInfoFromNodeInfo``), so a warm group (min-count 1 here) works; a group at
zero gets the kwok provider's template, which has no slices (``cloudprovider/kwok/
kwok_nodegroups.go`` ``TemplateNodeInfo``), so no claim fits it and it never scales up: the
first test has such a group beside the warm one and shows it. DRA needs no flag: cluster-
autoscaler 1.35+ locks ``--enable-dynamic-resource-allocation`` to true (``config/flags/
flags.go``) and takes ``DRAConsumableCapacity`` from k8s.io/kubernetes' defaults (``main.go``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpushare.core.dra.slices import slice_name
from gpushare.core.model.names import (
    ALLOCATION_MODE_DRA,
    DRA_DEVICE_CLASS,
    LABEL_ALLOCATION_MODE,
)
from harness.autoscalers import (
    CA_BINARY,
    GpuShape,
    build_autoscalers,
    dra_template,
    group_node_names,
    node_of_group,
    running_cluster_autoscaler,
    timed,
    unavailable,
    wait_bound,
    wait_group_size,
)
from harness.cluster import Cluster, wait_for
from harness.dra import (
    allocated_devices,
    claim_template,
    device_class,
    dra_pod,
    pod_claim,
    publish_slice,
    publishing_slices,
)
from harness.helpers import apply_all
from tests.support.e2e import create_nodes

BIG = GpuShape(gpus=4, gib=16)
SCALE_DOWN = (
    "--scale-down-enabled=true",
    "--scale-down-unneeded-time=5s",
    "--scale-down-delay-after-add=0s",
    "--scale-down-delay-after-delete=0s",
    "--scale-down-delay-after-failure=0s",
    # a node found unremovable is simulated again only after this (default 5 min,
    # core/scaledown/planner/planner.go)
    "--unremovable-node-recheck-timeout=5s",
    # every node is a candidate: what keeps one is the re-placement of its pods, GPU by GPU
    # (cluster-autoscaler counts a shared device with any claim as wholly used,
    # simulator/dynamicresources/utils/utilization.go)
    "--scale-down-utilization-threshold=1.0",
)


@pytest.fixture(scope="module")
def autoscalers() -> dict[str, Path]:
    binaries = build_autoscalers()
    reason = unavailable(binaries, CA_BINARY)
    if reason:
        pytest.skip(reason)
    return binaries


@pytest.fixture(scope="module")
def gpu_class(cluster: Cluster) -> Iterator[str]:
    """The ``gpu.gpushare.io`` DeviceClass, as the chart installs it."""
    cluster.kubectl("apply", "-f", "-", input=json.dumps(device_class()))
    yield DRA_DEVICE_CLASS
    cluster.kubectl("delete", "deviceclass", DRA_DEVICE_CLASS, "--wait=false", check=False)


def _namespace(cluster: Cluster, tag: str, sizes: set[int]) -> dict[str, str]:
    """The test's namespace with one claim template per pod size; the pods' node selector."""
    cluster.create_namespace(tag, check=False)
    apply_all(cluster, [claim_template(f"gpushare-{g}gi", tag, {"main": g}) for g in sizes])
    return {"gpushare-e2e": tag, LABEL_ALLOCATION_MODE: ALLOCATION_MODE_DRA}


def _warm(cluster: Cluster, template: dict[str, Any], name: str) -> str:
    """A node of the template's group as the kwok provider makes one, with its slice."""
    node = node_of_group(template, name)
    node["metadata"]["labels"]["kubernetes.io/hostname"] = name
    create_nodes(cluster, [node])
    publish_slice(cluster, cluster.kubectl_json("get", "node", name), BIG)
    return name


def _fill(cluster: Cluster, ns: str, select: dict[str, str], node: str, sizes: list[int]) -> None:
    """Pods of ``sizes`` GiB that land on ``node`` (the only one with room), one at a time so
    the stock allocator's first fit is known; evictable by the autoscaler."""
    for i, size in enumerate(sizes):
        name = f"{node}-{i}"
        pod = dra_pod(
            name,
            ns,
            f"gpushare-{size}gi",
            selector=select,
            annotations={"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"},
        )
        apply_all(cluster, [pod])
        assert wait_bound(cluster, ns, name, 60) == node


def _devices(cluster: Cluster, ns: str, pod: str) -> list[tuple[str, str]]:
    claim = pod_claim(cluster, ns, pod)
    return allocated_devices(claim) if claim else []


def _cleanup(cluster: Cluster, ns: str, nodes: list[str]) -> None:
    cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    if nodes:
        cluster.kubectl("delete", "node", *nodes, "--wait=false", "--ignore-not-found", check=False)
        slices = [slice_name(n) for n in nodes]
        cluster.kubectl("delete", "resourceslice", *slices, "--ignore-not-found", check=False)


def test_a_pod_no_single_gpu_holds_adds_a_node(
    cluster: Cluster, autoscalers: dict[str, Path], gpu_class: str
) -> None:
    """The trap's numbers: four 16 GiB GPUs with 3 GiB free each (12 GiB by the node's sum) and
    a pod asking 8 GiB of one GPU. cluster-autoscaler finds it no room on the warm node, adds
    one node to the warm group, and the pod's claim is allocated there; the group at zero
    beside it (same labels, no slices in its template) is never chosen: no claim fits it."""
    tag = "dra-trap"
    group, cold = f"{tag}-4x16", f"{tag}-cold"
    select = _namespace(cluster, tag, {13, 8})
    template = dra_template(group, labels=select, min_count=1)
    zero = dra_template(cold, labels=select, min_count=0)
    warm = _warm(cluster, template, f"{group}-warm0")
    try:
        _fill(cluster, tag, select, warm, [13] * 4)
        held = sorted(d for i in range(4) for d in _devices(cluster, tag, f"{warm}-{i}"))
        assert held == [(warm, f"gpu-{i}") for i in range(4)], held  # 3 GiB free on each
        with (
            running_cluster_autoscaler(
                cluster, autoscalers, [template, zero], name=f"ca-{tag}"
            ) as ca,
            publishing_slices(cluster, {group: BIG, cold: BIG}) as publisher,
        ):
            try:
                started = time.monotonic()
                apply_all(cluster, [dra_pod("ask", tag, "gpushare-8gi", selector=select)])
                nodes = wait_group_size(cluster, group, 2, 90, ca.process)
                timed("DRA, warm group: node added", started)
                (added,) = [n["metadata"]["name"] for n in nodes if n["metadata"]["name"] != warm]
                assert wait_bound(cluster, tag, "ask", 90, ca.process) == added
                timed("DRA, warm group: pod bound", started)
                sliced = publisher.published[added] - started
                print(f"[autoscaling] DRA, warm group: its slice published: {sliced:.1f}s")
                ((pool, _),) = _devices(cluster, tag, "ask")
                assert pool == added
                ca.wait_loops(3)
                assert ca.scale_ups() == [(group, 2)]
                assert group_node_names(cluster, group) == [warm, added]
                assert group_node_names(cluster, cold) == []
                # the group at zero: its template has no slices, so the claim fits no device
                refused = ca.log_lines(f"Pod {tag}/ask can't be scheduled on {cold}")
                assert refused, ca.tail(80)
                print("[autoscaling] the group at zero:", refused[0])
            except BaseException:
                print(f"--- {ca.process.name} log tail ---\n{ca.tail(80)}")
                raise
    finally:
        _cleanup(cluster, tag, [warm])


def test_scale_down_keeps_a_node_whose_claims_fit_nowhere_else(
    cluster: Cluster, autoscalers: dict[str, Path], gpu_class: str
) -> None:
    """Node b holds four 11 GiB claims (one a GPU), node a two 9 GiB claims (GPUs with 7, 7,
    16 and 16 GiB free); every node is a scale-down candidate. cluster-autoscaler re-places
    claims GPU by GPU: b's would fit two on a, a's none on b (5 GiB a GPU), so both stay,
    without gpushare's guard; once a's pods are gone, a (empty) is removed and b stays."""
    tag = "dra-down"
    group = f"{tag}-4x16"
    select = _namespace(cluster, tag, {11, 9})
    template = dra_template(group, labels=select, min_count=1)
    a, b = f"{group}-a", f"{group}-b"
    try:
        _warm(cluster, template, b)
        _fill(cluster, tag, select, b, [11] * 4)
        _warm(cluster, template, a)
        _fill(cluster, tag, select, a, [9, 9])
        assert [_devices(cluster, tag, f"{a}-{i}") for i in range(2)] == [
            [(a, "gpu-0")],
            [(a, "gpu-1")],
        ]
        with (
            running_cluster_autoscaler(
                cluster, autoscalers, [template], name=f"ca-{tag}", flags=SCALE_DOWN
            ) as ca,
            publishing_slices(cluster, {group: BIG}),
        ):
            try:
                ca.wait_loops(8, timeout=90)  # well past the 5 s unneeded time
                assert sorted(group_node_names(cluster, group)) == [a, b]
                # its claims re-placed GPU by GPU: none of a's on b (5 GiB free a GPU), two of
                # b's on a (16 GiB free on two GPUs); by the nodes' sums both would move
                for node, moved in ((a, "0 out of 2"), (b, "2 out of 4")):
                    why = f"Node {node} is not suitable for removal: can reschedule only {moved} "
                    assert ca.log_lines(why), ca.tail(80)
                # and its utilization counts a GPU with any claim as used: b's 69 % of GPU
                # memory is 100 %, a's 28 % is 50 %
                assert ca.log_lines(f"Node {b} - .* requested is 100% of allocatable")
                assert ca.log_lines(f"Node {a} - .* requested is 50% of allocatable")
                started = time.monotonic()
                cluster.kubectl("delete", "pod", "-n", tag, f"{a}-0", f"{a}-1")
                wait_for(
                    "node a (empty) removed",
                    lambda: a not in group_node_names(cluster, group),
                    120,
                    ca.process,
                )
                timed("DRA: empty node removed", started)
                ca.wait_loops(3)
                assert group_node_names(cluster, group) == [b]
                assert len(_devices(cluster, tag, f"{b}-0")) == 1
            except BaseException:
                print(f"--- {ca.process.name} log tail ---\n{ca.tail(80)}")
                raise
    finally:
        _cleanup(cluster, tag, [a, b])
