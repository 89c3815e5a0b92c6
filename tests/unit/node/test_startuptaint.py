"""Removing the startup taint through the Kubernetes port (the in-memory API): only once kubelet
allocates the GPU memory, only that taint, and never one that came back after the reading."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpushare.core.model.startuptaint import STARTUP_TAINT, Step
from gpushare.kube.memory import MemoryKube
from gpushare.kube.port import Conflict, KubeDict
from gpushare.node.startuptaint import CONFLICTS, release_once, release_when_serving

MEM = "aliyun.com/gpu-mem"
NODE = "gpu-node-1"
OTHER = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
OURS = {"key": STARTUP_TAINT, "effect": "NoSchedule"}


def kube_with(taints: list[dict[str, Any]], gpu_mem: str | None = None) -> MemoryKube:
    kube = MemoryKube()
    allocatable = {"cpu": "8"} | ({MEM: gpu_mem} if gpu_mem is not None else {})
    kube.put_node(
        {
            "metadata": {"name": NODE},
            "spec": {"taints": taints},
            "status": {"allocatable": allocatable, "capacity": dict(allocatable)},
        }
    )
    return kube


def taints(kube: MemoryKube) -> list[dict[str, Any]]:
    node: KubeDict = asyncio.run(kube.get_node(NODE))
    found: list[dict[str, Any]] = node["spec"].get("taints", [])
    return found


def test_kept_while_gpu_memory_is_absent_then_removed_with_the_others_kept() -> None:
    kube = kube_with([OTHER, OURS])
    naps: list[float] = []

    async def kubelet_takes_the_registration(seconds: float) -> None:
        naps.append(seconds)
        node = await kube.get_node(NODE)
        assert node["spec"]["taints"] == [OTHER, OURS]  # still there while gpu-mem is absent
        if len(naps) == 3:
            await kube.patch_node(NODE, capacity={MEM: "64"})

    done = asyncio.run(
        release_when_serving(
            kube, NODE, key=STARTUP_TAINT, resource=MEM, sleep=kubelet_takes_the_registration
        )
    )
    assert done.step is Step.REMOVE and done.removed == (OURS,)
    assert naps == [2.0, 2.0, 2.0]
    assert taints(kube) == [OTHER]


def test_a_node_without_the_taint_is_read_once_and_left_alone() -> None:
    kube = kube_with([OTHER], gpu_mem="64")
    done = asyncio.run(release_when_serving(kube, NODE, key=STARTUP_TAINT, resource=MEM))
    assert done.step is Step.DONE
    assert kube.calls.count("get_node") == 1 and "patch_node_json" not in kube.calls
    assert taints(kube) == [OTHER]


class ChangedUnderThePatch(MemoryKube):
    """Between each reading and the write, somebody changes the node's taints."""

    def __init__(self, changes: list[list[dict[str, Any]]]) -> None:
        super().__init__()
        self.changes = changes

    async def patch_node_json(self, name: str, operations: Any) -> KubeDict:
        if self.changes:
            node = await self.get_node(name)
            node["spec"]["taints"] = self.changes.pop(0)
            self.put_node(node)
        return await super().patch_node_json(name, operations)


def prepared(kube: ChangedUnderThePatch) -> ChangedUnderThePatch:
    kube.put_node(
        {
            "metadata": {"name": NODE},
            "spec": {"taints": [OURS]},
            "status": {"allocatable": {MEM: "64"}},
        }
    )
    return kube


def test_a_taint_added_after_the_reading_is_kept_and_ours_removed_on_the_next_try() -> None:
    late = {"key": "node.kubernetes.io/out-of-service", "effect": "NoExecute"}
    kube = prepared(ChangedUnderThePatch([[OURS, late]]))
    done = asyncio.run(release_once(kube, NODE, key=STARTUP_TAINT, resource=MEM))
    assert done.step is Step.REMOVE
    assert taints(kube) == [late]
    assert kube.calls.count("get_node") >= 2


def test_a_taint_removed_and_put_back_after_the_reading_is_decided_anew() -> None:
    """Removed by someone else and put back for another reason: the test of the node's
    version refuses the first write; the second reading decides again."""
    kube = prepared(ChangedUnderThePatch([[OURS]]))
    done = asyncio.run(release_once(kube, NODE, key=STARTUP_TAINT, resource=MEM))
    assert done.step is Step.REMOVE and taints(kube) == []


def test_a_node_that_keeps_changing_gives_up_after_the_conflicts_and_the_loop_retries() -> None:
    kube = prepared(ChangedUnderThePatch([[OURS, OTHER]] * CONFLICTS))
    with pytest.raises(Conflict):
        asyncio.run(release_once(kube, NODE, key=STARTUP_TAINT, resource=MEM))
    assert taints(kube) == [OURS, OTHER]
    naps: list[float] = []

    async def nap(seconds: float) -> None:
        naps.append(seconds)

    kube.changes = [[OURS, OTHER]] * CONFLICTS
    done = asyncio.run(release_when_serving(kube, NODE, key=STARTUP_TAINT, resource=MEM, sleep=nap))
    assert naps == [2.0] and done.step is Step.REMOVE and taints(kube) == [OTHER]


def test_the_in_memory_patch_refuses_a_failed_test_and_applies_nothing() -> None:
    kube = kube_with([OURS], gpu_mem="64")
    stale: list[dict[str, Any]] = [
        {"op": "test", "path": "/spec/taints", "value": [OTHER]},
        {"op": "replace", "path": "/spec/taints", "value": []},
    ]
    with pytest.raises(Conflict, match="testing value /spec/taints failed"):
        asyncio.run(kube.patch_node_json(NODE, stale))
    assert taints(kube) == [OURS]
