"""The autoscaling loop over the in-memory API: placeholders come and go, the guard is written.

The filter refuses a pod on every node (four GPUs with 3 GiB free each, the pod asks 8), the
loop makes a placeholder an autoscaler reads as needing a new node; once a new node takes the
pod, the placeholder goes. Only the replica whose kube-scheduler holds the Lease writes.
"""

from __future__ import annotations

import json
from typing import Any

from gpushare.core.autoscaling.placeholders import PLACEHOLDER_LABEL, PlaceholderSettings
from gpushare.core.autoscaling.scaledown import ANN_GUARD, CA_SCALE_DOWN_DISABLED
from gpushare.extender.autoscaling import Autoscaling, AutoscalingSettings
from gpushare.extender.wire import read_args
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod
from tests.support.rig import Rig, binding, run_with_rig

NS = "gpushare"
T0 = 1_700_000_000 * 10**9


def _node(name: str, created: str) -> dict[str, Any]:
    node = gpu_node(name, gpus_units=[16] * 4)
    node["metadata"]["creationTimestamp"] = created
    return node


async def _place(rig: Rig, pod: dict[str, Any], nodes: list[str]) -> str:
    answer = rig.extender.filter(read_args(json.dumps({"Pod": pod, "NodeNames": nodes}).encode()))
    if not answer.NodeNames:
        return ""
    node = answer.NodeNames[0]
    result = await rig.post("bind", binding(pod, node))
    assert not result.get("Error"), result
    await rig.settle()
    return str(node)


def _placeholders(kube: MemoryKube) -> list[dict[str, Any]]:
    return [
        p
        for p in kube.pods()
        if (p["metadata"].get("labels") or {}).get(PLACEHOLDER_LABEL) == "true"
    ]


def test_a_refused_pod_gets_a_placeholder_until_a_new_node_takes_it() -> None:
    kube = MemoryKube()
    kube.put_node(_node("n0", "2026-01-01T00:00:00Z"))
    fill = [kube.create_pod(gpu_pod(f"fill{i}", mem=13)) for i in range(4)]
    big = kube.create_pod(gpu_pod("big", mem=8))
    now = [T0]

    async def body(rig: Rig) -> None:
        rig.extender.clock_ns = lambda: now[0]
        for pod in fill:
            assert await _place(rig, pod, ["n0"]) == "n0"
        assert await _place(rig, big, ["n0"]) == ""  # 4 x 3 GiB free: no GPU holds 8
        loop = Autoscaling(
            api=kube,
            state=rig.cache.state,
            settings=AutoscalingSettings(
                placeholders=PlaceholderSettings(namespace=NS), guard=True, guard_every=1
            ),
            clock_ns=lambda: now[0],
        )
        loop.events = rig.extender.events
        assert (await loop.round()).created == []  # not settled yet
        now[0] += 10 * 10**9
        done = await loop.round()
        await rig.settle()
        assert len(done.created) == 1
        (held,) = _placeholders(kube)
        condition = held["status"]["conditions"][0]
        assert (condition["reason"], condition["status"]) == ("Unschedulable", "False")
        await rig.extender.events.drain()
        told = [e for e in kube.events() if e["reason"] == "GPUShareWaitingForNode"]
        assert [e["involvedObject"]["name"] for e in told] == ["big"]
        assert held["metadata"]["name"] in told[0]["message"]
        assert (await loop.round()).created == []  # it stands; nothing twice
        # n0's GPUs are 81 % used: guarded from scale-down
        assert kube._nodes["n0"]["metadata"]["annotations"][CA_SCALE_DOWN_DISABLED] == "true"

        kube.put_node(_node("n1", "2026-01-01T01:00:00Z"))  # the autoscaler's new node
        await rig.settle()
        assert await _place(rig, big, ["n0", "n1"]) == "n1"
        done = await loop.round()
        await rig.settle()
        assert done.deleted == [held["metadata"]["name"]]
        assert _placeholders(kube) == []

        for pod in fill:  # n0 empties: its guard is lifted
            kube.delete_pod("default", pod["metadata"]["name"])
        await rig.settle()
        done = await loop.round()
        await rig.settle()
        # n0 is empty; n1's one pod now fits n0 GPU by GPU, so n1 (guarded since big landed
        # there and fitted nowhere else) is free to go too
        assert done.released == ["n0", "n1"]
        assert ANN_GUARD not in kube._nodes["n0"]["metadata"]["annotations"]

    run_with_rig(kube, body)


def test_a_newer_node_that_refuses_the_pod_makes_a_new_placeholder() -> None:
    kube = MemoryKube()
    kube.put_node(_node("n0", "2026-01-01T00:00:00Z"))
    fill = [kube.create_pod(gpu_pod(f"fill{i}", mem=13)) for i in range(4)]
    big = kube.create_pod(gpu_pod("big", mem=15))
    now = [T0]

    async def body(rig: Rig) -> None:
        rig.extender.clock_ns = lambda: now[0]
        for pod in fill:
            await _place(rig, pod, ["n0"])
        await _place(rig, big, ["n0"])
        loop = Autoscaling(
            api=kube,
            state=rig.cache.state,
            settings=AutoscalingSettings(placeholders=PlaceholderSettings(namespace=NS)),
            clock_ns=lambda: now[0],
        )
        now[0] += 10 * 10**9
        first = (await loop.round()).created
        await rig.settle()
        # a node joined (long after the placeholder) and could not take it either: small GPUs
        small = gpu_node("n1", gpus_units=[8] * 4)
        small["metadata"]["creationTimestamp"] = "2099-01-01T00:00:00Z"
        kube.put_node(small)
        await rig.settle()
        assert await _place(rig, big, ["n0", "n1"]) == ""
        done = await loop.round()
        await rig.settle()
        assert done.deleted == first and len(done.created) == 1
        (held,) = _placeholders(kube)
        terms = held["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert terms[0]["matchFields"][0]["values"] == ["n0", "n1"]

    run_with_rig(kube, body)


def test_only_the_leading_replica_writes() -> None:
    kube = MemoryKube()
    kube.put_lease(
        {
            "metadata": {"namespace": NS, "name": "gpushare-scheduler"},
            "spec": {"holderIdentity": "sched-abc_5f0e"},
        }
    )

    async def body(rig: Rig) -> None:
        def loop(identity: str) -> Autoscaling:
            return Autoscaling(
                api=kube,
                state=rig.cache.state,
                settings=AutoscalingSettings(
                    placeholders=PlaceholderSettings(namespace=NS),
                    lease="gpushare-scheduler",
                    lease_namespace=NS,
                    identity=identity,
                ),
            )

        assert (await loop("sched-abc").round()).led
        assert not (await loop("sched-xyz").round()).led
        assert not (await loop("").round()).led

    run_with_rig(kube, body)
