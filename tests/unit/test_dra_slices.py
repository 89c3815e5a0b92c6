"""core.dra.slices: the slice a node publishes, and reading it back."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpushare.core.dra.slices import (
    SliceSpec,
    build_slice,
    device_name,
    gpus_from_slice,
    index_of,
    slice_name,
)
from gpushare.core.model.inventory import Gpu, Mode
from gpushare.core.model.units import MemoryUnit


def spec(*gpus: Gpu, unit: MemoryUnit = MemoryUnit.GiB) -> SliceSpec:
    return SliceSpec(node="n1", unit=unit, mode=Mode.CORE_MEM, gpus=gpus)


def test_one_device_per_gpu_in_service_with_both_capacities() -> None:
    obj = build_slice(
        spec(
            Gpu(0, 15, uuid="GPU-a", model="Tesla T4"),
            Gpu(1, 15, healthy=False, uuid="GPU-b"),
            Gpu(2, 15, disabled=True, uuid="GPU-c"),
        )
    )
    devices = obj["spec"]["devices"]
    assert [d["name"] for d in devices] == ["gpu-0"]
    memory = devices[0]["capacity"]["memory"]
    assert memory["value"] == "15Gi"
    assert memory["requestPolicy"]["validRange"] == {"min": "1Gi", "max": "15Gi", "step": "1Gi"}
    assert devices[0]["capacity"]["cores"]["requestPolicy"]["validRange"]["step"] == "5"
    assert devices[0]["allowMultipleAllocations"] is True
    assert obj["spec"]["pool"] == {"name": "n1", "generation": 1, "resourceSliceCount": 1}
    assert obj["metadata"]["name"] == slice_name("n1") == "n1-gpushare-io"


def test_the_fine_unit_steps_in_128_mib() -> None:
    obj = build_slice(spec(Gpu(0, 120, uuid="GPU-a"), unit=MemoryUnit.MiB128))
    memory = obj["spec"]["devices"][0]["capacity"]["memory"]
    assert memory["value"] == "15Gi"
    assert memory["requestPolicy"]["validRange"]["step"] == "128Mi"


def test_another_drivers_slice_is_not_read() -> None:
    assert gpus_from_slice({"spec": {"driver": "gpu.nvidia.com", "nodeName": "n1"}}) is None


@given(
    mems=st.lists(st.integers(min_value=1, max_value=640), min_size=1, max_size=8),
    fine=st.booleans(),
)
def test_reading_back_gives_the_gpus_in_service(mems: list[int], fine: bool) -> None:
    unit = MemoryUnit.MiB128 if fine else MemoryUnit.GiB
    gpus = tuple(Gpu(i, m, uuid=f"GPU-{i}", model="A10") for i, m in enumerate(mems))
    back = gpus_from_slice(build_slice(spec(*gpus, unit=unit)))
    assert back is not None
    assert back.unit is unit and back.mode is Mode.CORE_MEM
    assert back.gpus == gpus


def test_device_names_round_trip() -> None:
    assert index_of(device_name(7)) == 7
    assert index_of("mig-1") is None
