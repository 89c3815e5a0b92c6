"""core.dra.claims: the claim template and pod patch that a pod's ACK resources become."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.core.dra.claims import (
    CORE_MEM_SELECTOR,
    Conversion,
    Untouched,
    convert,
    demanded_by_pod,
    selection,
)
from gpushare.core.model.containers import ContainerKind
from gpushare.core.model.names import (
    ANN_DRA_REQUESTS,
    DRA_CLAIM_NAME,
    DRA_DEVICE_CLASS,
    DRA_SCHEDULING_GATE,
)
from gpushare.core.model.requests import PodRequest, Rejection, read_pod
from gpushare.core.model.units import MemoryUnit
from tests.support.jsonpatching import apply

MEM = "aliyun.com/gpu-mem"
CORE = "aliyun.com/gpu-core.percentage"


def gpu_pod(
    *containers: dict[str, Any],
    labels: dict[str, str] | None = None,
    init: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = init
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team-a", "labels": labels or {}},
        "spec": spec,
    }


def box(name: str, **limits: Any) -> dict[str, Any]:
    names = {"mem": MEM, "core": CORE}
    return {
        "name": name,
        "image": "busybox",
        "resources": {"limits": {names[k]: v for k, v in limits.items()}},
    }


def converted(pod: dict[str, Any], unit: MemoryUnit = MemoryUnit.GiB) -> Conversion:
    outcome = convert(pod, unit=unit)
    assert isinstance(outcome, Conversion), outcome
    return outcome


def mib(text: str) -> int:
    for suffix, factor in (("Gi", 1024), ("Mi", 1)):
        if text.endswith(suffix):
            return int(text[: -len(suffix)]) * factor
    raise AssertionError(text)


def test_the_seed_job_pod_becomes_one_request_of_3gi() -> None:
    pod = gpu_pod(box("gpu", mem=3))
    outcome = converted(pod)
    name = outcome.template_name
    assert name.startswith("gpushare-") and len(name) == len("gpushare-") + 10
    assert outcome.template["metadata"]["namespace"] == "team-a"
    assert outcome.template["spec"] == {
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": DRA_DEVICE_CLASS,
                            "allocationMode": "ExactCount",
                            "count": 1,
                            "capacity": {"requests": {"memory": "3Gi"}},
                        },
                    }
                ]
            }
        }
    }
    after = apply(pod, list(outcome.patch))
    assert after["spec"]["resourceClaims"] == [
        {"name": DRA_CLAIM_NAME, "resourceClaimTemplateName": name}
    ]
    assert after["spec"]["containers"][0]["resources"] == {
        "limits": {},
        "claims": [{"name": DRA_CLAIM_NAME, "request": "gpu"}],
    }
    assert after["spec"]["schedulingGates"] == [{"name": DRA_SCHEDULING_GATE}]
    assert json.loads(after["metadata"]["annotations"][ANN_DRA_REQUESTS]) == {
        "aliyun.com/gpu-count": 1,
        "containers": {"gpu": {MEM: 3}},
        "unit": "1GiB",
    }


def test_the_128mib_unit_asks_multiples_of_128mi() -> None:
    outcome = converted(gpu_pod(box("gpu", mem=3)), MemoryUnit.MiB128)
    assert outcome.requests[0].as_json(MemoryUnit.MiB128)["exactly"]["capacity"] == {
        "requests": {"memory": "384Mi"}
    }
    outcome = converted(gpu_pod(box("gpu", mem=16)), MemoryUnit.MiB128)
    exactly = outcome.template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert exactly["capacity"]["requests"]["memory"] == "2Gi"


def test_computing_power_asks_cores_on_core_mem_gpus() -> None:
    outcome = converted(gpu_pod(box("cuda", mem=4, core=30)))
    exactly = outcome.template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert exactly["capacity"]["requests"] == {"memory": "4Gi", "cores": "30"}
    assert exactly["selectors"] == [{"cel": {"expression": CORE_MEM_SELECTOR}}]
    after = apply(gpu_pod(box("cuda", mem=4, core=30)), list(outcome.patch))
    assert after["spec"]["containers"][0]["resources"]["limits"] == {}


def test_a_multi_gpu_pod_splits_evenly_and_keeps_its_devices_distinct() -> None:
    pod = gpu_pod(box("a", mem=8), labels={"aliyun.com/gpu-count": "2"})
    devices = converted(pod).template["spec"]["spec"]["devices"]
    assert devices["requests"][0]["exactly"]["count"] == 2
    assert devices["requests"][0]["exactly"]["capacity"]["requests"]["memory"] == "4Gi"
    assert devices["constraints"] == [{"requests": ["a"], "distinctAttribute": "gpushare.io/uuid"}]


def test_a_container_that_does_not_divide_gets_one_request_per_share() -> None:
    pod = gpu_pod(box("a", mem=3), box("b", mem=5), labels={"aliyun.com/gpu-count": "2"})
    outcome = converted(pod)
    shown = [(r.name, r.container, r.count, r.mem_units) for r in outcome.requests]
    assert shown == [("a", "a", 1, 2), ("a-1", "a", 1, 1), ("b", "b", 1, 3), ("b-1", "b", 1, 2)]
    after = apply(pod, list(outcome.patch))
    assert after["spec"]["containers"][0]["resources"]["claims"] == [
        {"name": DRA_CLAIM_NAME, "request": "a"},
        {"name": DRA_CLAIM_NAME, "request": "a-1"},
    ]


def test_a_request_name_never_takes_another_containers_name() -> None:
    pod = gpu_pod(box("a", mem=3), box("a-1", mem=3), labels={"aliyun.com/gpu-count": "2"})
    names = [r.name for r in converted(pod).requests]
    assert len(set(names)) == len(names) and "a-1" in names
    assert [r.container for r in converted(pod).requests if r.name == "a-1"] == ["a-1"]


def test_the_template_name_is_the_shape_not_the_pod() -> None:
    one = gpu_pod(box("gpu", mem=3))
    other = {**gpu_pod(box("gpu", mem=3)), "metadata": {"name": "q", "namespace": "team-a"}}
    assert converted(one).template_name == converted(other).template_name
    assert converted(one).template_name != converted(gpu_pod(box("gpu", mem=4))).template_name


def test_bad_requests_are_left_for_the_validating_webhook_with_the_same_reasons() -> None:
    pod = gpu_pod(box("gpu", mem="3Gi"))
    outcome = convert(pod)
    assert isinstance(outcome, Rejection)
    assert outcome.reasons == read_pod(pod).reasons  # type: ignore[union-attr]
    assert "unit suffix" in outcome.message


def test_pods_without_gpu_memory_or_with_their_own_claims_are_untouched() -> None:
    assert isinstance(convert(gpu_pod({"name": "c", "image": "x"})), Untouched)
    own = gpu_pod(box("gpu", mem=3))
    own["spec"]["resourceClaims"] = [{"name": "mine", "resourceClaimName": "x"}]
    outcome = convert(own)
    assert isinstance(outcome, Untouched) and "its own claims" in outcome.reason


def test_without_the_gate_no_gate_is_added_and_existing_gates_are_kept() -> None:
    pod = gpu_pod(box("gpu", mem=3))
    outcome = convert(pod, gate=False)
    assert isinstance(outcome, Conversion)
    assert "schedulingGates" not in apply(pod, list(outcome.patch))["spec"]
    assert "annotations" not in apply(pod, list(outcome.patch))["metadata"]
    pod["spec"]["schedulingGates"] = [{"name": "other"}]
    after = apply(pod, list(converted(pod).patch))
    assert after["spec"]["schedulingGates"] == [{"name": "other"}, {"name": DRA_SCHEDULING_GATE}]


def affinity(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]
            }
        }
    }


DRA_TERM = [{"key": "gpushare.io/allocation-mode", "operator": "In", "values": ["dra"]}]
OTHER_TERM = [{"key": "zone", "operator": "In", "values": ["a"]}]


@pytest.mark.parametrize(
    ("spec", "demanded"),
    [
        ({"nodeSelector": {"gpushare.io/allocation-mode": "dra"}}, True),
        ({"nodeSelector": {"gpushare.io/allocation-mode": "device-plugin"}}, False),
        ({"affinity": affinity(DRA_TERM)}, True),
        ({"affinity": affinity(DRA_TERM + OTHER_TERM, DRA_TERM)}, True),
        ({"affinity": affinity(DRA_TERM, OTHER_TERM)}, False),  # terms are ORed
        ({}, False),
    ],
)
def test_which_pods_demand_dra_nodes(spec: dict[str, Any], demanded: bool) -> None:
    pod = gpu_pod(box("gpu", mem=3))
    pod["spec"].update(spec)
    assert bool(demanded_by_pod(pod)) is demanded


def test_selection_namespace_first_then_pod_then_default() -> None:
    pod = gpu_pod(box("gpu", mem=3))
    assert "namespace" in selection(pod, namespace_selected=True, default_dra=False)
    assert selection(pod, namespace_selected=False, default_dra=False) == ""
    assert "dra.defaultMode" in selection(pod, namespace_selected=False, default_dra=True)


@st.composite
def ack_pods(draw: st.DrawFn) -> tuple[dict[str, Any], MemoryUnit]:
    unit = draw(st.sampled_from(list(MemoryUnit)))
    count = draw(st.integers(1, 4))
    apps = draw(st.integers(1, 3))
    sidecars = draw(st.integers(0, 1))
    inits = draw(st.integers(0, 1))

    def one(name: str) -> dict[str, Any]:
        mem = draw(st.integers(1, 40))
        limits: dict[str, Any] = {"mem": mem * count if draw(st.booleans()) else mem}
        if draw(st.booleans()):
            limits["core"] = 5 * count * draw(st.integers(1, 4))
        return box(name, **limits)

    containers = [one(f"app{i}") for i in range(apps)]
    init = [{**one(f"side{i}"), "restartPolicy": "Always"} for i in range(sidecars)]
    init += [one(f"init{i}") for i in range(inits)]
    labels = {"aliyun.com/gpu-count": str(count)} if count > 1 else {}
    return gpu_pod(*containers, labels=labels, init=init), unit


@settings(max_examples=200, deadline=None)
@given(ack_pods())
def test_requests_hold_exactly_what_the_containers_ask(
    case: tuple[dict[str, Any], MemoryUnit],
) -> None:
    pod, unit = case
    read = read_pod(pod, unit=unit)
    if not isinstance(read, PodRequest):
        return  # rules the core refuses (computing power per GPU) are left as written
    outcome = converted(pod, unit)
    requests = outcome.template["spec"]["spec"]["devices"]["requests"]
    held = 0
    for request in requests:
        memory = mib(request["exactly"]["capacity"]["requests"]["memory"])
        assert memory % unit.mib == 0 and memory > 0  # exact in the unit: no rounding by the server
        held += request["exactly"]["count"] * memory
    assert held == outcome.mem_mib == sum(c.mem_units for c in read.containers) * unit.mib
    if not any(c.kind is ContainerKind.INIT for c in read.containers):
        assert held == read.mem_units * unit.mib  # the pod's memory, as Kubernetes counts it
    for c in read.containers:
        mine = [r for r in outcome.requests if r.container == c.name]
        assert sum(r.count * r.mem_units for r in mine) == c.mem_units
        assert sum(r.count for r in mine) <= read.gpu_count
    after = apply(pod, list(outcome.patch))
    for kind in ("initContainers", "containers"):
        for container in after["spec"].get(kind) or []:
            assert MEM not in container["resources"]["limits"]
            assert CORE not in container["resources"]["limits"]
            assert {c["request"] for c in container["resources"]["claims"]} == {
                r.name for r in outcome.requests if r.container == container["name"]
            }
    assert converted(pod, unit).template_name == outcome.template_name
