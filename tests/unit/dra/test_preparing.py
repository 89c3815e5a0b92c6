"""What a claim's containers are handed: the device plugin's hand-off, from consumed capacity."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare.core.model.inventory import Mode
from gpushare.core.model.units import MemoryUnit
from gpushare.dra.preparing import (
    CLAIM_KIND,
    Refusal,
    check_claim,
    claim_spec,
    claim_users,
    hand_out,
    prepared_devices,
    request_weight,
    results_of,
    signatures,
)
from gpushare.node.cdi import HandOff, Strategy
from gpushare.node.gpus import GpuInfo

GPUS = [GpuInfo(i, f"GPU-{i}aaaa", "Tesla-T4", 15 * 1024 + 100) for i in range(2)]


def claim(*results: dict[str, Any], uid: str = "u1") -> dict[str, Any]:
    return {
        "metadata": {"name": "c", "namespace": "ns", "uid": uid},
        "status": {"allocation": {"devices": {"results": list(results)}}},
    }


def result(device: str, memory: str | None = "3Gi", cores: str | None = "30", **kw: Any) -> dict:
    consumed = {}
    if memory is not None:
        consumed["memory"] = memory
    if cores is not None:
        consumed["cores"] = cores
    return {
        "request": kw.get("request", "gpu"),
        "driver": kw.get("driver", "gpushare.io"),
        "pool": kw.get("pool", "n1"),
        "device": device,
        "consumedCapacity": consumed,
    }


def test_results_take_memory_units_and_cores_from_consumed_capacity() -> None:
    got = results_of(claim(result("gpu-1")), pool="n1", unit=MemoryUnit.GiB, gpus=GPUS)
    assert not isinstance(got, Refusal)
    assert [(r.index, r.mem_units, r.core_pct) for r in got] == [(1, 3, 30)]


def test_results_in_128mib_units() -> None:
    got = results_of(
        claim(result("gpu-0", memory="384Mi", cores=None)),
        pool="n1",
        unit=MemoryUnit.MiB128,
        gpus=GPUS,
    )
    assert not isinstance(got, Refusal)
    assert [(r.mem_units, r.core_pct) for r in got] == [(3, 0)]


def test_other_drivers_and_pools_are_not_ours() -> None:
    got = results_of(
        claim(result("gpu-0", driver="other.io"), result("gpu-0", pool="n2"), result("gpu-0")),
        pool="n1",
        unit=MemoryUnit.GiB,
        gpus=GPUS,
    )
    assert not isinstance(got, Refusal) and len(got) == 1


def test_no_consumed_capacity_is_the_whole_gpu() -> None:
    got = results_of(
        claim(result("gpu-0", memory=None, cores=None)), pool="n1", unit=MemoryUnit.GiB, gpus=GPUS
    )
    assert not isinstance(got, Refusal) and got[0].mem_units == 15


@pytest.mark.parametrize(
    ("res", "words"),
    [
        (result("gpu-7"), "is not a GPU of node n1"),
        (result("gpu-0", memory="1536Mi"), "not a whole number of the node's unit 1GiB"),
        (result("gpu-0", cores="101"), "not a whole percent"),
        (result("gpu-0", memory="lots"), "consumedCapacity.memory"),
    ],
)
def test_refusals_name_the_field_and_value(res: dict[str, Any], words: str) -> None:
    got = results_of(claim(res), pool="n1", unit=MemoryUnit.GiB, gpus=GPUS)
    assert isinstance(got, Refusal) and words in got.reason and "results[0]" in got.reason


def test_unallocated_and_unhealthy_are_refused() -> None:
    bare = {"metadata": {"name": "c", "namespace": "ns"}}
    assert isinstance(results_of(bare, pool="n1", unit=MemoryUnit.GiB, gpus=GPUS), Refusal)
    sick = [GPUS[0], GpuInfo(1, "GPU-1", "T4", 15 * 1024, healthy=False)]
    got = results_of(claim(result("gpu-1")), pool="n1", unit=MemoryUnit.GiB, gpus=sick)
    assert isinstance(got, Refusal) and "unhealthy" in got.reason


def test_a_claim_made_again_is_not_the_one_kubelet_named() -> None:
    refusal = check_claim(claim(uid="new"), namespace="ns", name="c", uid="old")
    assert refusal is not None and "UID new" in refusal.reason and "UID old" in refusal.reason
    assert check_claim(claim(uid="old"), namespace="ns", name="c", uid="old") is None


def test_hand_out_is_the_device_plugins_environment() -> None:
    got = results_of(claim(result("gpu-1")), pool="n1", unit=MemoryUnit.GiB, gpus=GPUS)
    assert not isinstance(got, Refusal)
    [handout] = hand_out(
        got, gpus=GPUS, unit=MemoryUnit.GiB, mode=Mode.SHARE, handoff=HandOff(Strategy.ENVVAR)
    )
    envs = handout.answer.envs
    assert envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-1aaaa"
    assert envs["ALIYUN_COM_GPU_MEM_CONTAINER"] == "3"
    assert envs["ALIYUN_COM_GPU_MEM_DEV"] == "15"
    assert envs["ALIYUN_COM_GPU_MEM_IDX"] == "1"
    assert envs["ALIYUN_COM_GPU_MEM_POD"] == "3"
    assert envs["ALIYUN_COM_GPU_CORE_PERCENTAGE"] == "30"
    assert envs["GPUSHARE_MEM_UNIT"] == "1GiB"


def test_cdi_cri_names_the_gpu_beside_the_claims_device() -> None:
    got = results_of(
        claim(result("gpu-0", request="a"), result("gpu-1", request="a")),
        pool="n1",
        unit=MemoryUnit.GiB,
        gpus=GPUS,
    )
    assert not isinstance(got, Refusal)
    handoff = HandOff(Strategy.CDI_CRI)
    handouts = hand_out(got, gpus=GPUS, unit=MemoryUnit.GiB, mode=Mode.SHARE, handoff=handoff)
    answers = {h.request: h.answer for h in handouts}
    assert answers["a"].envs["NVIDIA_VISIBLE_DEVICES"] == "void"
    devices = prepared_devices("u1", handouts, answers, pool="n1", gpus=GPUS)
    assert [d.cdi_ids for d in devices] == [
        ("nvidia.com/gpu=GPU-0aaaa", f"{CLAIM_KIND}=u1-a"),
        ("nvidia.com/gpu=GPU-1aaaa",),
    ]
    spec = claim_spec("u1", answers)
    assert spec["kind"] == CLAIM_KIND and spec["devices"][0]["name"] == "u1-a"
    assert "ALIYUN_COM_GPU_MEM_CONTAINER=6" in spec["devices"][0]["containerEdits"]["env"]


@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 1), st.integers(1, 15)),
        min_size=1,
        max_size=4,
    )
)
def test_signatures_add_up_to_the_claim(parts: list[tuple[str, int, int]]) -> None:
    results = results_of(
        claim(*(result(f"gpu-{i}", memory=f"{m}Gi", request=r) for r, i, m in parts)),
        pool="n1",
        unit=MemoryUnit.GiB,
        gpus=GPUS,
    )
    assert not isinstance(results, Refusal)
    sigs = signatures(results)
    assert sum(s.count for s in sigs.values()) == sum(m for _, _, m in parts)
    assert all(s.pod_mem_units == sum(m for _, _, m in parts) for s in sigs.values())


def weighted_pod(weights: dict[str, str | None], *, template: bool = False) -> dict[str, Any]:
    """A pod whose containers use request ``gpu`` of claim ``c`` (through a template when asked)."""
    containers = []
    for name, weight in weights.items():
        c: dict[str, Any] = {"name": name, "resources": {"claims": [{"name": "g"}]}}
        if weight is not None:
            c["env"] = [{"name": "ALIYUN_COM_GPU_SCHD_WEIGHT", "value": weight}]
        containers.append(c)
    containers.append(
        {"name": "other", "env": [{"name": "ALIYUN_COM_GPU_SCHD_WEIGHT", "value": "1"}]}
    )
    if template:
        return {
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "resourceClaims": [{"name": "g", "resourceClaimTemplateName": "t"}],
                "containers": containers,
            },
            "status": {"resourceClaimStatuses": [{"name": "g", "resourceClaimName": "c"}]},
        }
    return {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {
            "resourceClaims": [{"name": "g", "resourceClaimName": "c"}],
            "containers": containers,
        },
    }


def test_the_weight_is_the_lowest_the_claims_containers_ask() -> None:
    pod = weighted_pod({"a": "3", "b": "5"})
    assert request_weight(pod, "c", "gpu", max_weight=8).weight == 3
    assert (
        request_weight(weighted_pod({"a": "4"}, template=True), "c", "gpu", max_weight=8).weight
        == 4
    )
    assert request_weight(weighted_pod({"a": None}), "c", "gpu", max_weight=8).weight == 1
    assert request_weight(pod, "other-claim", "gpu", max_weight=8).weight == 1


def test_a_bad_weight_is_named() -> None:
    reading = request_weight(weighted_pod({"a": "99"}), "c", "gpu", max_weight=8)
    assert reading.weight == 1 and "ALIYUN_COM_GPU_SCHD_WEIGHT" in reading.problem


def test_the_claims_users_are_its_reserved_pods() -> None:
    c = claim()
    c["status"]["reservedFor"] = [
        {"resource": "pods", "name": "p", "uid": "x"},
        {"resource": "jobs", "name": "j"},
    ]
    assert claim_users(c) == ("p",)
