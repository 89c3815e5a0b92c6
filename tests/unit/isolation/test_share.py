"""The share-mode helper against fake framework modules (no PyTorch, TensorFlow or JAX here)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from gpushare.isolation.share import JAX_FRACTION, ShareEnvError, apply, read_slice


class FakeTorchCuda:
    def __init__(self, devices: int) -> None:
        self.devices = devices
        self.fractions: dict[int, float] = {}

    def is_available(self) -> bool:
        return self.devices > 0

    def device_count(self) -> int:
        return self.devices

    def set_per_process_memory_fraction(self, fraction: float, device: int) -> None:
        assert 0 < fraction <= 1
        self.fractions[device] = fraction


class FakeTfConfig:
    def __init__(self, gpus: int, initialised: bool = False) -> None:
        self.gpus = [f"/physical_device:GPU:{i}" for i in range(gpus)]
        self.initialised = initialised
        self.limits: dict[str, int] = {}

    def list_physical_devices(self, kind: str) -> list[str]:
        return self.gpus if kind == "GPU" else []

    def LogicalDeviceConfiguration(self, memory_limit: int) -> Any:
        return SimpleNamespace(memory_limit=memory_limit)

    def set_logical_device_configuration(self, device: str, logical: list[Any]) -> None:
        if self.initialised:
            raise RuntimeError("Virtual devices cannot be modified after being initialized")
        self.limits[device] = logical[0].memory_limit


ENV = {"ALIYUN_COM_GPU_MEM_CONTAINER": "3", "ALIYUN_COM_GPU_MEM_DEV": "15"}


def test_torch_gets_the_fraction_of_its_device() -> None:
    torch = SimpleNamespace(cuda=FakeTorchCuda(1))
    env = dict(ENV)
    applied = apply(env=env, modules={"torch": torch})
    assert torch.cuda.fractions == {0: pytest.approx(0.2)}
    assert applied.done == (
        "torch: device 0 fraction 0.2",
        "jax: XLA_PYTHON_CLIENT_MEM_FRACTION=0.2",
    )
    assert applied.slice is not None and applied.slice.limits_mib == (3072,)
    assert "tensorflow: not imported" in applied.skipped


def test_tensorflow_gets_a_memory_limit_in_mib_at_the_128mib_unit() -> None:
    tf = SimpleNamespace(config=FakeTfConfig(1))
    env = {
        "ALIYUN_COM_GPU_MEM_CONTAINER": "24",
        "ALIYUN_COM_GPU_MEM_DEV": "120",
        "GPUSHARE_MEM_UNIT": "128MiB",
    }
    applied = apply(env=env, modules={"tensorflow": tf}, frameworks=["tensorflow"])
    assert tf.config.limits == {"/physical_device:GPU:0": 3072}
    assert applied.done == ("tensorflow: device 0 memory_limit 3072 MiB",)


def test_tensorflow_already_initialised_says_to_call_apply_first() -> None:
    tf = SimpleNamespace(config=FakeTfConfig(1, initialised=True))
    with pytest.raises(RuntimeError, match=r"call gpushare\.isolation\.share\.apply\(\) before"):
        apply(env=dict(ENV), modules={"tensorflow": tf}, frameworks=["tensorflow"])


def test_jax_fraction_is_set_in_the_environment_and_a_late_import_is_reported() -> None:
    env = dict(ENV)
    applied = apply(env=env, modules={}, frameworks=["jax"])
    assert env[JAX_FRACTION] == "0.2" and applied.skipped == ()
    late = apply(env=dict(ENV), modules={"jax": object()}, frameworks=["jax"])
    assert late.skipped == ("jax: already imported, so its backend may ignore the fraction",)


def test_each_visible_gpu_gets_its_own_share() -> None:
    torch = SimpleNamespace(cuda=FakeTorchCuda(2))
    env = {**ENV, "ALIYUN_COM_GPU_MEM_CONTAINER": "9", "GPUSHARE_MEM_PER_GPU": "1:6,3:3"}
    apply(env=env, modules={"torch": torch}, frameworks=["torch"])
    assert torch.cuda.fractions == {0: pytest.approx(0.4), 1: pytest.approx(0.2)}


def test_outside_a_gpushare_container_nothing_is_applied() -> None:
    torch = SimpleNamespace(cuda=FakeTorchCuda(1))
    applied = apply(env={}, modules={"torch": torch})
    assert applied.slice is None and applied.done == () and torch.cuda.fractions == {}


def test_no_gpu_visible_is_reported() -> None:
    applied = apply(env=dict(ENV), modules={"torch": SimpleNamespace(cuda=FakeTorchCuda(0))})
    assert "torch: no GPU visible" in applied.skipped


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"ALIYUN_COM_GPU_MEM_CONTAINER": "three", "ALIYUN_COM_GPU_MEM_DEV": "15"},
            "ALIYUN_COM_GPU_MEM_CONTAINER='three': must be a whole number of memory units above 0",
        ),
        (
            {"ALIYUN_COM_GPU_MEM_CONTAINER": "3", "ALIYUN_COM_GPU_MEM_DEV": "0"},
            "ALIYUN_COM_GPU_MEM_DEV='0': must be a whole number of memory units above 0",
        ),
        (
            {"ALIYUN_COM_GPU_MEM_CONTAINER": "3"},
            "ALIYUN_COM_GPU_MEM_DEV is not set but ALIYUN_COM_GPU_MEM_CONTAINER is",
        ),
        ({**ENV, "GPUSHARE_MEM_UNIT": "2GiB"}, "GPUSHARE_MEM_UNIT='2GiB': must be 1GiB or 128MiB"),
        (
            {**ENV, "ALIYUN_COM_GPU_MEM_CONTAINER": "16"},
            "ALIYUN_COM_GPU_MEM_CONTAINER='16' (GPUSHARE_MEM_PER_GPU='') is more than "
            "ALIYUN_COM_GPU_MEM_DEV='15'",
        ),
        ({**ENV, "GPUSHARE_MEM_PER_GPU": "0=3"}, "GPUSHARE_MEM_PER_GPU='0=3': must be index:units"),
    ],
)
def test_malformed_variables_name_the_variable_the_value_and_the_rule(
    env: dict[str, str], message: str
) -> None:
    with pytest.raises(ShareEnvError) as err:
        read_slice(env)
    assert message in str(err.value)


def test_unknown_framework_is_refused() -> None:
    with pytest.raises(ValueError, match="framework 'mxnet' is not supported"):
        apply(env=dict(ENV), modules={}, frameworks=["mxnet"])
