"""gpushare's allocation of DRA claims, and the ledger that reads them back.

Nodes are published as the driver publishes them (``build_slice``), claims written as the
webhook writes them (docs/dra.md), and every allocation is read back through the ledger, so
what is checked is what the API server would store.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.core.booking.ledger import Ledger
from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.core.dra.allocate import (
    Allocated,
    NodeView,
    NotOurs,
    Refused,
    allocate,
    node_refusal,
    read_requests,
)
from gpushare.core.dra.ledger import DraLedger, read_ledger
from gpushare.core.dra.slices import SliceSpec, build_slice
from gpushare.core.model.hostresources import NOTHING, HostResources
from gpushare.core.model.inventory import CORE_PER_GPU, Gpu, Mode
from gpushare.core.model.names import DRA_DEVICE_CLASS, DRA_DRIVER, LABEL_PLACEMENT
from gpushare.core.model.units import MemoryUnit

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def a_slice(node: str, sizes: tuple[int, ...], mode: Mode = Mode.SHARE) -> dict[str, Any]:
    gpus = tuple(Gpu(index=i, mem_units=m, uuid=f"GPU-{node}-{i}") for i, m in enumerate(sizes))
    return build_slice(SliceSpec(node=node, unit=MemoryUnit.GiB, mode=mode, gpus=gpus))


def a_node(node: str, placement: str | None = None, **spec: Any) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": node}
    if placement:
        labels[LABEL_PLACEMENT] = placement
    return {
        "metadata": {"name": node, "labels": labels},
        "spec": spec,
        "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}},
    }


def a_pod(name: str, cpu: str = "1", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {
            "containers": [{"name": "main", "resources": {"requests": {"cpu": cpu}}}],
            **spec,
        },
    }


def a_claim(name: str, gib: int, count: int = 1, cores: int = 0) -> dict[str, Any]:
    requests: dict[str, Any] = {"memory": f"{gib}Gi"}
    if cores:
        requests["cores"] = str(cores)
    return {
        "metadata": {"name": f"{name}-gpushare", "namespace": "default", "uid": f"claim-{name}"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "main",
                        "exactly": {
                            "deviceClassName": DRA_DEVICE_CLASS,
                            "allocationMode": "ExactCount",
                            "count": count,
                            "capacity": {"requests": requests},
                        },
                    }
                ]
            }
        },
    }


class World:
    """Slices, nodes and claims, allocated one pod at a time as the extender would."""

    def __init__(self, nodes: dict[str, tuple[tuple[int, ...], str | None]]) -> None:
        self.slices = [a_slice(n, sizes) for n, (sizes, _) in nodes.items()]
        self.nodes = {n: a_node(n, placement) for n, (_, placement) in nodes.items()}
        self.claims: list[dict[str, Any]] = []
        self.scheduler = Scheduler(Settings(unit=MemoryUnit.GiB))

    def ledger(self) -> tuple[DraLedger, Ledger]:
        dra = read_ledger(self.slices, self.claims)
        ledger = Ledger()
        dra.book(ledger)
        return dra, ledger

    def allocate(self, name: str, gib: int, count: int = 1) -> Allocated | Refused | NotOurs:
        dra, ledger = self.ledger()
        views = [
            NodeView(dra.inventory(n, self.nodes[n]), self.nodes[n], NOTHING, 0)
            for n in sorted(self.nodes)
        ]
        claim = a_claim(name, gib, count)
        outcome = allocate(a_pod(name), claim, views, ledger, self.scheduler, unit=MemoryUnit.GiB)
        if isinstance(outcome, Allocated):
            claim["status"] = outcome.status
            self.claims.append(claim)
        return outcome


def devices(outcome: Allocated | Refused | NotOurs) -> list[tuple[str, str]]:
    assert isinstance(outcome, Allocated), outcome
    results = outcome.status["allocation"]["devices"]["results"]
    return [(r["pool"], r["device"]) for r in results]


def test_binpack_puts_the_second_pod_on_the_first_pods_gpu() -> None:
    world = World({"n1": ((16, 16), None)})
    assert devices(world.allocate("a", 4)) == [("n1", "gpu-0")]
    assert devices(world.allocate("b", 4)) == [("n1", "gpu-0")]


def test_spread_node_puts_the_second_pod_on_another_gpu() -> None:
    world = World({"n1": ((16, 16), "spread")})
    first = devices(world.allocate("a", 4))
    second = devices(world.allocate("b", 4))
    assert first != second  # first-fit would put both on gpu-0


def test_best_fit_where_first_fit_would_fragment() -> None:
    # gpu-0 has 6 GiB free, gpu-1 3 GiB: a 3 GiB pod goes to gpu-1 (first-fit: gpu-0), so a
    # 6 GiB pod still fits after it
    world = World({"n1": ((16, 16), None)})
    world.allocate("a", 10)
    world.allocate("b", 13)
    assert sorted(devices(world.allocate("c", 3))) == [("n1", "gpu-1")]
    assert devices(world.allocate("d", 6)) == [("n1", "gpu-0")]


def test_status_is_what_the_api_server_accepts() -> None:
    world = World({"n1": ((16, 16), None)})
    outcome = world.allocate("a", 8, count=2)
    assert isinstance(outcome, Allocated)
    allocation = outcome.status["allocation"]
    results = allocation["devices"]["results"]
    assert {r["device"] for r in results} == {"gpu-0", "gpu-1"}
    for result in results:
        assert result["driver"] == DRA_DRIVER and result["request"] == "main"
        assert UUID.match(result["shareID"]) and uuid.UUID(result["shareID"])
        assert result["consumedCapacity"] == {"memory": "8Gi", "cores": "0"}
    assert allocation["nodeSelector"]["nodeSelectorTerms"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    ]
    assert outcome.status["reservedFor"] == [{"resource": "pods", "name": "a", "uid": "uid-a"}]


def test_refused_with_reasons_when_nothing_fits() -> None:
    world = World({"n1": ((16,), None)})
    world.allocate("a", 12)
    outcome = world.allocate("b", 8)
    assert isinstance(outcome, Refused)
    assert "GPU0" in outcome.message


def test_claims_that_are_not_ours() -> None:
    claim = a_claim("a", 4)
    claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "gpu.nvidia.com"
    assert isinstance(read_requests(claim), NotOurs)
    whole = a_claim("b", 4)
    del whole["spec"]["devices"]["requests"][0]["exactly"]["capacity"]
    assert "whole-GPU" in str(read_requests(whole))


def test_node_refusal_sees_taints_selectors_and_host_room() -> None:
    world = World({"n1": ((16,), None)})
    dra, _ = world.ledger()
    tainted = a_node("n1", taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}])
    view = NodeView(dra.inventory("n1", tainted), tainted, NOTHING, 0)
    assert "taint" in (node_refusal(a_pod("p"), view) or "")
    tolerant = a_pod("p", tolerations=[{"key": "k", "operator": "Exists"}])
    assert node_refusal(tolerant, view) is None
    plain = a_node("n1")
    view = NodeView(dra.inventory("n1", plain), plain, NOTHING, 0)
    assert "nodeSelector" in (node_refusal(a_pod("p", nodeSelector={"x": "y"}), view) or "")
    full = NodeView(dra.inventory("n1", plain), plain, HostResources(7500, 0), 0)
    assert "CPU" in (node_refusal(a_pod("p", cpu="1"), full) or "")
    assert node_refusal(a_pod("p", cpu="500m"), full) is None


def test_ledger_reports_results_it_does_not_count() -> None:
    world = World({"n1": ((16,), None)})
    world.allocate("a", 4)
    stray = a_claim("x", 4)
    stray["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "main", "driver": DRA_DRIVER, "pool": "n9", "device": "gpu-0"},
                    {"request": "main", "driver": DRA_DRIVER, "pool": "n1", "device": "gpu-7"},
                    {"request": "main", "driver": "gpu.nvidia.com", "pool": "n1", "device": "g"},
                ]
            }
        }
    }
    dra = read_ledger(world.slices, [*world.claims, stray])
    assert len(dra.problems) == 2
    assert dra.usage("n1").on(0).mem_units == 4
    assert [h.name for h in dra.holdings] == ["a-gpushare"]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 16), st.integers(1, 2)),
        min_size=1,
        max_size=25,
    ),
    st.sampled_from([None, "spread"]),
)
def test_no_gpu_is_overfilled_and_the_ledger_sums_the_claims(
    pods: list[tuple[int, int]], placement: str | None
) -> None:
    world = World({"n1": ((16, 16), placement), "n2": ((24, 12, 12), None)})
    for step, (gib, count) in enumerate(pods):
        world.allocate(f"p{step}", gib, count)
    dra, ledger = world.ledger()
    assert not dra.problems and not dra.over
    consumed: dict[tuple[str, int], int] = {}
    for claim in world.claims:
        results = claim["status"]["allocation"]["devices"]["results"]
        seen = [(r["pool"], r["device"]) for r in results]
        assert len(seen) == len(set(seen))  # no device twice in one claim
        assert len({pool for pool, _ in seen}) == 1
        for result in results:
            key = (result["pool"], int(result["device"].removeprefix("gpu-")))
            consumed[key] = consumed.get(key, 0) + int(result["consumedCapacity"]["memory"][:-2])
    for node, spec in dra.nodes.items():
        for gpu in spec.gpus:
            held = dra.usage(node).on(gpu.index)
            assert held.mem_units <= gpu.mem_units and held.core_pct <= CORE_PER_GPU
            assert held.mem_units == consumed.get((node, gpu.index), 0)
            assert ledger.usage(node).on(gpu.index).mem_units == held.mem_units


def test_the_pod_count_the_ledger_keeps_fills_a_node() -> None:
    ledger = Ledger()
    for name in ("x", "y"):
        bound = a_pod(name)
        bound["spec"]["nodeName"] = "n1"
        ledger.observe(bound)
    assert ledger.pods_on("n1") == 2
    world = World({"n1": ((16,), None)})
    dra, _ = world.ledger()
    node = a_node("n1")
    node["status"]["allocatable"]["pods"] = "2"
    view = NodeView(dra.inventory("n1", node), node, NOTHING, ledger.pods_on("n1"))
    assert "2/2 pods" in (node_refusal(a_pod("p"), view) or "")
    ledger.forget("uid-x")
    assert ledger.pods_on("n1") == 1


def _result(memory: str, device: str = "gpu-0", cores: str = "0") -> dict[str, Any]:
    return {
        "request": "main",
        "driver": DRA_DRIVER,
        "pool": "n1",
        "device": device,
        "consumedCapacity": {"memory": memory, "cores": cores},
    }


def test_what_counts_is_the_recorded_capacity_and_overfilling_is_reported() -> None:
    world = World({"n1": ((16,), None)})
    asks_little = a_claim("t", 1)  # the spec asked 1 GiB; the status records what was granted
    asks_little["status"] = {"allocation": {"devices": {"results": [_result("12Gi")]}}}
    second = a_claim("u", 8)
    second["status"] = {"allocation": {"devices": {"results": [_result("8Gi", cores="60")]}}}
    dra = read_ledger(world.slices, [asks_little, second])
    assert dra.usage("n1").on(0).mem_units == 20
    assert len(dra.over) == 1 and "20/16" in dra.over[0]
    odd = a_claim("v", 1)
    odd["status"] = {"allocation": {"devices": {"results": [_result("1500Mi")]}}}
    dra = read_ledger(world.slices, [odd])
    assert not dra.holdings and "whole units" in dra.problems[0].message


def test_the_webhooks_core_mem_claim_is_placed_on_core_mem_gpus() -> None:
    from gpushare.core.dra.claims import CORE_MEM_SELECTOR

    slices = [a_slice("n1", (16,)), a_slice("n2", (16,), Mode.CORE_MEM)]
    nodes = {n: a_node(n) for n in ("n1", "n2")}
    claim = a_claim("c", 4, cores=30)
    claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": CORE_MEM_SELECTOR}}
    ]
    dra = read_ledger(slices, ())
    ledger = Ledger()
    views = [NodeView(dra.inventory(n, nodes[n]), nodes[n], NOTHING, 0) for n in sorted(nodes)]
    scheduler = Scheduler(Settings(unit=MemoryUnit.GiB))
    outcome = allocate(a_pod("c"), claim, views, ledger, scheduler, unit=MemoryUnit.GiB)
    assert devices(outcome) == [("n2", "gpu-0")]
    assert isinstance(outcome, Allocated)
    consumed = outcome.status["allocation"]["devices"]["results"][0]["consumedCapacity"]
    assert consumed == {"memory": "4Gi", "cores": "30"}


def test_the_webhooks_template_is_read_back() -> None:
    from gpushare.core.dra.claims import claim_requests, template_spec
    from gpushare.core.model.requests import PodRequest, read_pod
    from gpushare.kube.objects import gpu_pod

    asked = read_pod(gpu_pod("w", mem=6, gpu_count="2"))
    assert isinstance(asked, PodRequest)
    spec = template_spec(claim_requests(asked), MemoryUnit.GiB)["spec"]
    claim = {"metadata": {"name": "w", "namespace": "default", "uid": "claim-w"}, "spec": spec}
    read = read_requests(claim)
    assert not isinstance(read, NotOurs), read
    assert [(r.count, r.memory_bytes // 2**30) for r in read] == [(2, 3)]
