"""Scale-up with the real node autoscalers: a pending shared-GPU pod adds exactly one node of the
right group, and gpushare's extender binds it there.

cluster-autoscaler 1.36.1 and Karpenter v1.15.0 run for real with their kwok providers beside the
loopback control plane (harness/autoscalers.py); kube-scheduler's ``ack-co-scheduler`` profile
and the gpushare extender place the pods. Two groups exist each time, a 4 x 16 GiB GPU group and
a 1 x 8 GiB one, both selected by the pod: only the first holds a pod asking 12 GiB, so the
autoscaler must pick it. Facts about why this works (templates carry ``aliyun.com/gpu-mem`` in
allocatable; CA counts a pod Unschedulable by any scheduler; Karpenter fits extended resources
of its instance types by totals) are in ../shared/docs/AUTOSCALERS.md, 1a-1c.

The tests skip without the autoscaler binaries' sources (cluster-autoscaler's is in
../shared/vendor); ``make autoscalers`` builds both.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpushare.core.model.units import MemoryUnit
from harness.autoscalers import (
    CA_BINARY,
    GROUP_LABEL,
    KARPENTER_BINARY,
    GpuShape,
    build_autoscalers,
    gpu_instance_type,
    gpu_template,
    group_node_names,
    node_of_group,
    nodepool,
    publishing_gpus,
    running_cluster_autoscaler,
    running_karpenter,
    timed,
    unavailable,
    wait_bound,
    wait_group_size,
)
from harness.cluster import Cluster
from harness.helpers import apply_all, gpu_pod_manifest
from tests.support.e2e import create_nodes

BIG = GpuShape(gpus=4, gib=16)
SMALL = GpuShape(gpus=1, gib=8)
ASK_GIB = 12
"""More than a SMALL node has, less than one BIG GPU."""
UNITS = {"gib": MemoryUnit.GiB, "mib128": MemoryUnit.MiB128}


@pytest.fixture(scope="session")
def autoscalers() -> dict[str, Path]:
    return build_autoscalers()


@pytest.fixture(scope="session")
def ca_binaries(autoscalers: dict[str, Path]) -> dict[str, Path]:
    """The binaries, where cluster-autoscaler can run (else the test skips before the control
    plane starts: session fixtures come first, in argument order)."""
    need(autoscalers, CA_BINARY)
    return autoscalers


@pytest.fixture(scope="session")
def karpenter_binaries(autoscalers: dict[str, Path]) -> dict[str, Path]:
    need(autoscalers, KARPENTER_BINARY)
    return autoscalers


@pytest.fixture(params=sorted(UNITS), ids=sorted(UNITS))
def unit(request: pytest.FixtureRequest, cluster: Cluster) -> Iterator[MemoryUnit]:
    """The extender counting in this unit for the test, back at 1 GiB after it."""
    chosen = UNITS[request.param]
    if cluster.extender_unit != chosen.value:
        cluster.start_extender(unit=chosen.value)
    yield chosen
    if cluster.extender_unit != MemoryUnit.GiB.value:
        cluster.start_extender(unit=MemoryUnit.GiB.value)


def shaped(shape: GpuShape, unit: MemoryUnit) -> GpuShape:
    return GpuShape(gpus=shape.gpus, gib=shape.gib, unit=unit, model=shape.model)


def units_of(gib: int, unit: MemoryUnit) -> int:
    return gib * 1024 // unit.mib


def need(binaries: dict[str, Path], name: str) -> None:
    """Skip where the autoscaler cannot run, saying why; under CI (which has ../shared) that is
    a failure rather than a silent skip."""
    reason = unavailable(binaries, name)
    if reason and os.environ.get("CI") == "true":
        pytest.fail(f"in CI: {reason}")
    if reason:
        pytest.skip(reason)


def namespace(cluster: Cluster, name: str) -> str:
    cluster.create_namespace(name, check=False)
    return name


def drop_namespace(cluster: Cluster, name: str) -> None:
    """Its pods at once (their nodes are gone with the autoscaler: nothing would confirm a
    graceful end, and the next autoscaler would see them bound to missing nodes), then it."""
    cluster.kubectl(
        "delete", "pods", "--all", "-n", name, "--force", "--grace-period=0", check=False
    )
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def run_ca_scaleup(
    cluster: Cluster, binaries: dict[str, Path], unit: MemoryUnit, *, warm: bool
) -> None:
    """One pending 12 GiB pod beside a BIG and a SMALL group (the BIG one warm and full, with
    ``warm``): exactly one BIG node is added and the pod is bound to it."""
    tag = f"ca-{'warm' if warm else 'zero'}-{unit.name.lower()}"
    big, small = f"{tag}-4x16", f"{tag}-1x8"
    select = {"gpushare-e2e": tag}
    templates = [
        gpu_template(big, shaped(BIG, unit), labels=select),
        gpu_template(small, shaped(SMALL, unit), labels=select),
    ]
    ns = namespace(cluster, tag)
    warm_nodes: list[str] = []
    try:
        if warm:
            warm_nodes = [f"{big}-warm0"]
            create_nodes(cluster, [node_of_group(templates[0], warm_nodes[0])])
            fill = units_of(BIG.gib, unit)
            apply_all(
                cluster,
                [gpu_pod_manifest(f"fill{i}", ns, fill, selector=select) for i in range(BIG.gpus)],
            )
            for i in range(BIG.gpus):
                assert wait_bound(cluster, ns, f"fill{i}", 60) == warm_nodes[0]
        with (
            running_cluster_autoscaler(cluster, binaries, templates, name=f"ca-{tag}") as ca,
            publishing_gpus(cluster, {big: shaped(BIG, unit), small: shaped(SMALL, unit)}),
        ):
            started = time.monotonic()
            apply_all(
                cluster, [gpu_pod_manifest("ask", ns, units_of(ASK_GIB, unit), selector=select)]
            )
            try:
                nodes = wait_group_size(cluster, big, len(warm_nodes) + 1, 60, ca.process)
                timed(f"{tag}: node added", started)
                landed = wait_bound(cluster, ns, "ask", 60, ca.process)
                timed(f"{tag}: pod bound", started)
                added = [
                    n["metadata"]["name"] for n in nodes if n["metadata"]["name"] not in warm_nodes
                ]
                assert landed == added[0], (landed, added)
                ca.wait_loops(3)  # no second thoughts: the count stays put
                assert group_node_names(cluster, big) == [*warm_nodes, *added]
                assert group_node_names(cluster, small) == []
                assert ca.scale_ups() == [(big, len(warm_nodes) + 1)], ca.scale_ups()
            except BaseException:
                print(f"--- {ca.process.name} log tail ---\n{ca.tail(80)}")
                raise
    finally:
        drop_namespace(cluster, ns)
        cluster.kubectl(
            "delete", "nodes", *warm_nodes, "--wait=false", check=False
        ) if warm_nodes else None


def test_cluster_autoscaler_adds_one_node_from_zero(
    ca_binaries: dict[str, Path], cluster: Cluster, unit: MemoryUnit
) -> None:
    run_ca_scaleup(cluster, ca_binaries, unit, warm=False)


def test_cluster_autoscaler_adds_one_node_to_a_warm_pool(
    ca_binaries: dict[str, Path], cluster: Cluster, unit: MemoryUnit
) -> None:
    run_ca_scaleup(cluster, ca_binaries, unit, warm=True)


def run_karpenter_scaleup(
    cluster: Cluster, binaries: dict[str, Path], unit: MemoryUnit, *, warm: bool
) -> None:
    """One pending 12 GiB pod beside a BIG and a SMALL NodePool (with ``warm``, after four
    pods of a whole GPU each made Karpenter add one BIG node, which they fill): exactly one BIG
    node is added for it and the pod is bound there.

    Karpenter's kwok Node has the instance type's gpu-mem and gpu-count; the GPU inventory
    comes from the device plugin's stand-in (harness.autoscalers.publishing_gpus). The SMALL
    type is the cheaper, so Karpenter would take it if it held the pod."""
    tag = f"kp-{'warm' if warm else 'zero'}-{unit.name.lower()}"
    big, small = f"{tag}-4x16", f"{tag}-1x8"
    select = {"gpushare-e2e": tag}
    types = [
        gpu_instance_type(big, shaped(BIG, unit), price=4.0),
        gpu_instance_type(small, shaped(SMALL, unit), price=1.0),
    ]
    pools = [nodepool(big, [big], labels=select), nodepool(small, [small], labels=select)]
    ns = namespace(cluster, tag)
    try:
        with (
            running_karpenter(
                cluster, binaries, types, pools, name=f"karpenter-{tag}"
            ) as karpenter,
            publishing_gpus(cluster, {big: shaped(BIG, unit), small: shaped(SMALL, unit)}),
        ):
            try:
                warm_nodes: list[str] = []
                if warm:
                    fill = units_of(BIG.gib, unit)
                    apply_all(
                        cluster,
                        [
                            gpu_pod_manifest(f"fill{i}", ns, fill, selector=select)
                            for i in range(BIG.gpus)
                        ],
                    )
                    wait_group_size(cluster, big, 1, 90, karpenter.process)
                    warm_nodes = sorted(
                        {wait_bound(cluster, ns, f"fill{i}", 60) for i in range(BIG.gpus)}
                    )
                    assert len(warm_nodes) == 1, warm_nodes
                started = time.monotonic()
                apply_all(
                    cluster, [gpu_pod_manifest("ask", ns, units_of(ASK_GIB, unit), selector=select)]
                )
                nodes = wait_group_size(cluster, big, len(warm_nodes) + 1, 90, karpenter.process)
                timed(f"{tag}: node added", started)
                landed = wait_bound(cluster, ns, "ask", 60, karpenter.process)
                timed(f"{tag}: pod bound", started)
                added = [
                    n["metadata"]["name"] for n in nodes if n["metadata"]["name"] not in warm_nodes
                ]
                assert landed == added[0], (landed, added)
                status = nodes[-1]["status"]
                print("Karpenter's node: capacity", status["capacity"])
                print("Karpenter's node: allocatable", status["allocatable"])
                time.sleep(3)  # a few batching windows: no second NodeClaim
                assert sorted(group_node_names(cluster, big)) == sorted([*warm_nodes, landed])
                assert group_node_names(cluster, small) == []
                claims = [
                    c
                    for c in karpenter.nodeclaims()
                    if c["metadata"]["labels"].get(GROUP_LABEL) in (big, small)
                ]
                assert len(claims) == len(warm_nodes) + 1, [c["metadata"]["name"] for c in claims]
            except BaseException:
                print(f"--- {karpenter.process.name} log tail ---\n{karpenter.tail(80)}")
                raise
    finally:
        drop_namespace(cluster, ns)


def test_karpenter_adds_one_node_from_zero(
    karpenter_binaries: dict[str, Path], cluster: Cluster, unit: MemoryUnit
) -> None:
    run_karpenter_scaleup(cluster, karpenter_binaries, unit, warm=False)


def test_karpenter_adds_one_node_to_a_warm_pool(
    karpenter_binaries: dict[str, Path], cluster: Cluster, unit: MemoryUnit
) -> None:
    run_karpenter_scaleup(cluster, karpenter_binaries, unit, warm=True)
