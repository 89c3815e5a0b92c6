"""The ResourceSlice the DRA driver publishes for its node, and the GPUs read back from one.

One slice per node (its pool is the node's name), one device per GPU in service: a GPU that is
unhealthy or taken out of service is left out, so neither allocator can hand it out (issue: health
in DRA mode). Each device may be allocated to many claims (``allowMultipleAllocations``) and has
two consumable capacities (KEP-5075, k8s.io/api v0.36 ``resource/v1`` ``DeviceCapacity``):

- ``memory``: the GPU's memory rounded down to the node's unit, requested in steps of the unit, so
  the API server's rounding (up to ``min + n*step``) reproduces ACK's 1 GiB / 128 MiB units; a
  claim that requests no memory consumes the default, the whole GPU;
- ``cores``: 100 percent in steps of 5 (ACK's ``gpu-core.percentage``); default 0, ACK's share
  semantics where computing power is not reserved.

Pure: the driver's adapter writes what ``build_slice`` returns; the ledger, inspect and the tests
read slices through ``gpus_from_slice``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpushare.core.model.inventory import Gpu, Mode
from gpushare.core.model.names import (
    DRA_CAPACITY_CORES,
    DRA_CAPACITY_MEMORY,
    DRA_DRIVER,
)
from gpushare.core.model.units import MemoryUnit

CORE_STEP = 5
"""Computing power is requested in steps of 5 percent."""

SLICE_API_VERSION = "resource.k8s.io/v1"


def device_name(index: int) -> str:
    """A GPU's device name in the slice: ``gpu-<index>`` (a DNS label, stable across restarts)."""
    return f"gpu-{index}"


def index_of(device: str) -> int | None:
    """The GPU index a device name carries, or None when it is not one of ours."""
    prefix, _, number = device.partition("-")
    if prefix != "gpu" or not number.isdigit():
        return None
    return int(number)


def slice_name(node: str) -> str:
    """The slice's object name: the node's name with the driver's, one slice per node."""
    return f"{node}-{DRA_DRIVER.replace('.', '-')}"


def quantity(mib: int) -> str:
    """A memory amount as a Kubernetes quantity, in whole GiB where it is one."""
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


@dataclass(frozen=True)
class SliceSpec:
    """What a node's slice says: its node, unit, sharing mode, and the GPUs in service."""

    node: str
    unit: MemoryUnit
    mode: Mode
    gpus: tuple[Gpu, ...]
    generation: int = 1


def _device(gpu: Gpu, unit: MemoryUnit, mode: Mode) -> dict[str, Any]:
    step = quantity(unit.mib)
    memory = quantity(gpu.mem_units * unit.mib)
    return {
        "name": device_name(gpu.index),
        "attributes": {
            "uuid": {"string": gpu.uuid},
            "index": {"int": gpu.index},
            "productName": {"string": gpu.model},
            "unit": {"string": unit.value},
            "mode": {"string": mode.value},
        },
        "capacity": {
            DRA_CAPACITY_MEMORY: {
                "value": memory,
                "requestPolicy": {
                    "default": memory,
                    "validRange": {"min": step, "max": memory, "step": step},
                },
            },
            DRA_CAPACITY_CORES: {
                "value": "100",
                "requestPolicy": {
                    "default": "0",
                    "validRange": {"min": "0", "max": "100", "step": str(CORE_STEP)},
                },
            },
        },
        "allowMultipleAllocations": True,
    }


def build_slice(spec: SliceSpec) -> dict[str, Any]:
    """The ResourceSlice object for ``spec``: only GPUs in service become devices."""
    return {
        "apiVersion": SLICE_API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(spec.node)},
        "spec": {
            "driver": DRA_DRIVER,
            "nodeName": spec.node,
            "pool": {"name": spec.node, "generation": spec.generation, "resourceSliceCount": 1},
            "devices": [
                _device(gpu, spec.unit, spec.mode)
                for gpu in sorted(spec.gpus, key=lambda g: g.index)
                if gpu.in_service and gpu.mem_units > 0
            ],
        },
    }


def _mib(text: str) -> int | None:
    """MiB in a quantity this module writes (``<n>Gi`` or ``<n>Mi``); None for anything else."""
    for suffix, factor in (("Gi", 1024), ("Mi", 1)):
        if text.endswith(suffix) and text[: -len(suffix)].isdigit():
            return int(text[: -len(suffix)]) * factor
    return None


def gpus_from_slice(obj: dict[str, Any]) -> SliceSpec | None:
    """The node, unit, mode and GPUs a gpushare slice publishes; None for another driver's slice
    or one this module did not write (a device whose unit or memory it cannot read is left out)."""
    spec = obj.get("spec") or {}
    if spec.get("driver") != DRA_DRIVER or not spec.get("nodeName"):
        return None
    gpus: list[Gpu] = []
    unit = MemoryUnit.GiB
    mode = Mode.NONE
    for device in spec.get("devices") or []:
        index = index_of(str(device.get("name", "")))
        attributes = device.get("attributes") or {}
        try:
            unit = MemoryUnit.parse(str((attributes.get("unit") or {}).get("string", "")))
        except ValueError:
            continue
        mode = Mode.from_label((attributes.get("mode") or {}).get("string"))
        memory = ((device.get("capacity") or {}).get(DRA_CAPACITY_MEMORY) or {}).get("value")
        mib = _mib(str(memory)) if memory is not None else None
        if index is None or mib is None:
            continue
        gpus.append(
            Gpu(
                index=index,
                mem_units=mib // unit.mib,
                uuid=str((attributes.get("uuid") or {}).get("string", "")),
                model=str((attributes.get("productName") or {}).get("string", "")),
            )
        )
    pool = spec.get("pool") or {}
    return SliceSpec(
        node=str(spec["nodeName"]),
        unit=unit,
        mode=mode,
        gpus=tuple(gpus),
        generation=int(pool.get("generation", 1)),
    )
