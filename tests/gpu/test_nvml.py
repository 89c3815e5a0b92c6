"""On a machine with an NVIDIA GPU: the NVML backend sees it and Allocate's env points at it.

Skipped cleanly where NVML cannot be initialised (no driver, no GPU), which is every CI run.
"""

from __future__ import annotations

import pytest

from gpushare.core.model.inventory import Mode
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.handoff import MEM, Signature
from gpushare.deviceplugin.kubelet.devices import devices
from gpushare.node.gpus import mem_units
from gpushare.node.handout import container_answer


def nvml_or_skip() -> object:
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception as err:  # pynvml raises its own error types, or the library is absent
        pytest.skip(f"no NVIDIA GPU here: {type(err).__name__}: {err}")
    if count == 0:
        pytest.skip("NVML found no GPU")
    from gpushare.node.gpus import NvmlGpus

    return NvmlGpus()


@pytest.mark.gpu
def test_nvml_backend_sees_the_gpus_and_env_points_at_them() -> None:
    source = nvml_or_skip()
    gpus = source.gpus()  # type: ignore[attr-defined]
    print("NVML GPUs:", gpus)
    assert gpus and all(g.uuid.startswith(("GPU-", "MIG-")) and g.memory_mib > 0 for g in gpus)
    units = mem_units(gpus[0], MemoryUnit.GiB)
    assert (
        len([d for d in devices(MEM, gpus, MemoryUnit.GiB) if d.id.startswith(gpus[0].uuid)])
        == units
    )
    signature = Signature(MEM, 2, ((gpus[0].index, 2),), 2)
    envs = container_answer(signature, gpus, MemoryUnit.GiB, Mode.SHARE).envs
    assert envs["NVIDIA_VISIBLE_DEVICES"] == gpus[0].uuid
    assert envs["ALIYUN_COM_GPU_MEM_DEV"] == str(units)
