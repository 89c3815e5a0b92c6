"""Planning ahead: pending pods get their top node booked and set as nominatedNodeName.

kube-scheduler then filters the nominated node alone (``core.planning``); here its calls are
made by hand, as in the other extender tests, with the node list it would send.
"""

from __future__ import annotations

from typing import Any

from gpushare.core.scheduling import Settings
from gpushare.extender.planner import Planner
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod
from gpushare.kube.port import Conflict, KubeDict

from .conftest import Rig, binding, run_with_rig
from .test_extender import NAMES, placed_pod, spread_cluster


def stored(kube: MemoryKube, pod: KubeDict) -> KubeDict:
    [now] = [p for p in kube.pods() if p["metadata"]["uid"] == pod["metadata"]["uid"]]
    return now


def nominated(kube: MemoryKube, pod: KubeDict) -> str:
    return str(stored(kube, pod).get("status", {}).get("nominatedNodeName", ""))


async def plans(rig: Rig) -> dict[str, float]:
    text = (await rig.client.get("/metrics")).text
    counted = {}
    for line in text.splitlines():
        if line.startswith("gpushare_plans_total{"):
            label, value = line.split("} ")
            counted[label.split('"')[1]] = float(value)
    return counted


async def kube_scheduler_is_asking(rig: Rig) -> None:
    """A filter call for a pod of another profile: kube-scheduler is at work."""
    other = gpu_pod("elsewhere", mem=1, scheduler="default-scheduler")
    other["metadata"]["uid"] = "uid-elsewhere"
    await rig.post("filter", {"Pod": other, "NodeNames": []})


def test_pods_are_planned_in_queue_order_a_window_at_a_time_and_the_plan_is_taken() -> None:
    kube = spread_cluster()
    first = kube.create_pod(gpu_pod("a-first", mem=3))
    second = kube.create_pod(gpu_pod("b-second", mem=4))
    third = kube.create_pod(gpu_pod("c-third", mem=6))

    async def body(rig: Rig) -> None:
        planner = Planner(rig.extender, ahead=2)
        await rig.settle()
        for pod in (third, second, first):  # the order the cache learns of them does not count
            planner.pending(stored(kube, pod))
        assert await planner.plan_some() == 0, "kube-scheduler is not asking: no plans"
        await kube_scheduler_is_asking(rig)
        assert await planner.plan_some() == 2
        # the same choice the filter makes with every node: n1, the one half full, fits both
        assert nominated(kube, first) == "n1" and nominated(kube, second) == "n1"
        assert nominated(kube, third) == "", "two wait; the third waits for room"
        ledger = rig.cache.ledger
        assert ledger.usage("n1").mem_units == 8 + 3 + 4
        # kube-scheduler tries the nominated node alone; the filter says it fits
        await rig.settle()
        pod = stored(kube, first)
        answer = await rig.post("filter", {"Pod": pod, "NodeNames": ["n1"]})
        assert answer["NodeNames"] == ["n1"]
        assert ledger.usage("n1").mem_units == 8 + 3 + 4, "given back and booked again"
        assert (await rig.post("bind", binding(pod, "n1")))["Error"] == ""
        assert nominated(kube, first) == "", "the binding clears the nomination"
        await rig.settle()
        assert await planner.plan_some() == 1
        assert nominated(kube, third) == "n0", "n1 is full (8 + 3 + 4)"
        assert await planner.plan_some() == 0
        assert (await plans(rig)) == {"nominated": 3.0}

    run_with_rig(kube, body, Settings(policy="binpack"))


def placements(kube: MemoryKube) -> dict[str, str]:
    return {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in kube.pods()}


def test_planned_pods_land_where_filtering_every_node_puts_them() -> None:
    """The same pods, once with kube-scheduler sending every node to filter (one at a time,
    as it does), once planned a window ahead and sent their nominated node alone."""
    sizes = [3, 7, 1, 12, 4, 4, 9, 2, 6, 5, 8, 1, 3, 10]

    def cluster() -> MemoryKube:
        kube = MemoryKube()
        for i in range(4):
            kube.put_node(gpu_node(f"n{i}", gpus_units=[15, 15]))
        kube.create_pod(placed_pod(kube, "busy", 5, "n2"))
        for i, mem in enumerate(sizes):
            kube.create_pod(gpu_pod(f"p{i:02d}", mem=mem))
        return kube

    names = [f"n{i}" for i in range(4)]

    async def every_node(rig: Rig) -> None:
        for i in range(len(sizes)):
            [pod] = [p for p in rig.kube.pods() if p["metadata"]["name"] == f"p{i:02d}"]
            answer = await rig.post("filter", {"Pod": pod, "NodeNames": names})
            [node] = answer["NodeNames"]
            assert (await rig.post("bind", binding(pod, node)))["Error"] == ""
            await rig.settle()

    async def planned(rig: Rig) -> None:
        planner = Planner(rig.extender, ahead=4)
        await kube_scheduler_is_asking(rig)
        for i in range(len(sizes)):
            await planner.plan_some()
            [pod] = [p for p in rig.kube.pods() if p["metadata"]["name"] == f"p{i:02d}"]
            node = pod["status"]["nominatedNodeName"]
            answer = await rig.post("filter", {"Pod": pod, "NodeNames": [node]})
            assert answer["NodeNames"] == [node]
            assert (await rig.post("bind", binding(pod, node)))["Error"] == ""
            await rig.settle()
        assert (await plans(rig)) == {"nominated": float(len(sizes))}

    expected, got = cluster(), cluster()
    run_with_rig(expected, every_node)
    run_with_rig(got, planned)
    assert placements(got) == placements(expected)
    assert len(set(placements(got).values())) > 1


def test_a_plan_keeps_to_the_nodes_kube_schedulers_own_filters_admit() -> None:
    kube = MemoryKube()
    taint = {"key": "team", "value": "a", "effect": "NoSchedule"}
    nodes: list[dict[str, Any]] = [
        {"taints": [taint]},
        {"unschedulable": True},
        {},
    ]
    for i, spec in enumerate(nodes):
        node = gpu_node(f"n{i}", gpus_units=[15])
        node.setdefault("spec", {}).update(spec)
        node["metadata"].setdefault("labels", {})["zone"] = "z1" if i < 2 else "z2"
        kube.put_node(node)
        if i < 2:  # the two restricted nodes are the fuller ones: packing would choose them
            kube.create_pod(placed_pod(kube, f"busy{i}", 8, f"n{i}"))
    plain = kube.create_pod(gpu_pod("plain", mem=3))
    tolerant = gpu_pod("tolerant", mem=3)
    tolerant["spec"]["tolerations"] = [{"key": "team", "operator": "Equal", "value": "a"}]
    tolerant = kube.create_pod(tolerant)
    pinned = gpu_pod("pinned", mem=3)
    pinned["spec"]["tolerations"] = [{"operator": "Exists"}]
    pinned["spec"]["nodeSelector"] = {"zone": "z2"}
    pinned = kube.create_pod(pinned)

    async def body(rig: Rig) -> None:
        planner = Planner(rig.extender, ahead=10)
        await rig.settle()
        await kube_scheduler_is_asking(rig)
        assert await planner.plan_some() == 3
        assert nominated(kube, plain) == "n2"
        assert nominated(kube, tolerant) == "n0"
        assert nominated(kube, pinned) == "n2"

    run_with_rig(kube, body)


def test_pods_kube_scheduler_would_score_otherwise_are_left_to_it() -> None:
    kube = spread_cluster()
    other = kube.create_pod(gpu_pod("other", mem=3, scheduler="default-scheduler"))
    soft = gpu_pod("soft", mem=3)
    soft["spec"]["affinity"] = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": []}}
            ]
        }
    }
    soft = kube.create_pod(soft)
    preempting = gpu_pod("preempting", mem=3)
    preempting["status"] = {"nominatedNodeName": "n0"}
    preempting = kube.create_pod(preempting)
    cpu_only = gpu_pod("cpu-only", mem=1)
    cpu_only["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m"}}
    cpu_only = kube.create_pod(cpu_only)
    too_big = kube.create_pod(gpu_pod("too-big", mem=16))

    async def body(rig: Rig) -> None:
        planner = Planner(rig.extender, ahead=10)
        await rig.settle()
        await kube_scheduler_is_asking(rig)
        assert await planner.plan_some() == 0
        for pod in (other, soft, cpu_only, too_big):
            assert nominated(kube, pod) == ""
        assert nominated(kube, preempting) == "n0", "kube-scheduler's own nomination stands"
        assert list(rig.cache.ledger.intents()) == []
        assert await plans(rig) == {
            "other_profile": 1.0,
            "stated_preference": 1.0,
            "nominated_already": 1.0,
            "no_gpu": 1.0,
            "no_fit": 1.0,
        }
        assert "nominate_pod" not in kube.calls

    run_with_rig(kube, body)


class NominationConflicts(MemoryKube):
    """The pod changed since the watch showed it (kube-scheduler nominated or bound it)."""

    async def nominate_pod(
        self, namespace: str, name: str, node: str, *, resource_version: str
    ) -> None:
        self.calls.append("nominate_pod")
        raise Conflict(f"pod {namespace}/{name} changed")


def test_a_plan_whose_write_fails_gives_its_booking_back_and_is_not_tried_again() -> None:
    kube = NominationConflicts()
    for i in range(3):
        kube.put_node(gpu_node(f"n{i}", gpus_units=[15]))
    pod = kube.create_pod(gpu_pod("p", mem=3))

    async def body(rig: Rig) -> None:
        planner = Planner(rig.extender, ahead=10)
        await rig.settle()
        await kube_scheduler_is_asking(rig)
        assert await planner.plan_some() == 0
        assert list(rig.cache.ledger.intents()) == []
        assert all(rig.cache.ledger.usage(n).mem_units == 0 for n in NAMES)
        assert await plans(rig) == {"conflict": 1.0}
        planner.pending(stored(kube, pod))  # the watch shows the pod again
        assert await planner.plan_some() == 0
        assert kube.calls.count("nominate_pod") == 1, "each pending pod is considered once"

    run_with_rig(kube, body)


def test_a_plan_holds_its_place_until_its_pod_leaves_or_its_booking_runs_out() -> None:
    """A plan kube-scheduler never reaches (stopped, another scheduler) gives its GPUs back
    after ``ttl_s``, its nomination is cleared, and its place goes to the next pod."""
    kube = spread_cluster()
    first = kube.create_pod(gpu_pod("a", mem=3))
    second = kube.create_pod(gpu_pod("b", mem=3))
    kube.create_pod(gpu_pod("c", mem=3))

    async def body(rig: Rig) -> None:
        start = rig.extender.clock_ns()
        planner = Planner(rig.extender, ahead=1, ttl_s=10)
        await rig.settle()
        await kube_scheduler_is_asking(rig)
        assert await planner.plan_some() == 1
        assert planner.waiting == {first["metadata"]["uid"]: "n1"}
        assert await planner.plan_some() == 0
        kube.delete_pod("default", "a")
        await rig.settle()
        assert await planner.plan_some() == 1
        assert planner.waiting == {second["metadata"]["uid"]: "n1"}
        assert await planner.plan_some() == 0
        rig.extender.clock_ns = lambda: start + 9_000_000_000
        await kube_scheduler_is_asking(rig)
        assert await planner.plan_some() == 0, "b's booking still holds"
        await rig.settle()  # the watch shows b nominated
        rig.extender.clock_ns = lambda: start + 10_000_000_000
        await kube_scheduler_is_asking(rig)
        assert await planner.plan_some() == 1
        # kube-scheduler counts a nominated pod on its node: the nomination goes with the booking
        assert nominated(kube, second) == "", "cleared with its booking"
        ledger = rig.cache.ledger
        assert [a.uid for a, _ in ledger.intents()] != [second["metadata"]["uid"]]
        assert len(list(ledger.intents())) == 1
        assert (await plans(rig)) == {"nominated": 3.0, "cleared": 1.0}

    run_with_rig(kube, body, Settings(policy="binpack"))
