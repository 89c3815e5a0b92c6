"""``gpushare device-plugin``'s flags become one validated ``PluginOptions`` before the node is
read."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from gpushare.cli.deviceplugin import device_plugin
from gpushare.cli.errors import CommandError
from gpushare.cli.pluginoptions import PluginOptions
from gpushare.core.model.units import MemoryUnit
from gpushare.isolation.policy import Policy
from gpushare.node.cdi import Strategy


@pytest.fixture(autouse=True)
def no_chart_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chart's environment variables behind some flags, unset here."""
    for name in (
        "GPUSHARE_ISOLATION_POLICY",
        "GPUSHARE_MAX_PODS_PER_GPU",
        "GPUSHARE_DEVICE_LIST_STRATEGY",
    ):
        monkeypatch.delenv(name, raising=False)


def options(*args: str) -> PluginOptions:
    ctx = device_plugin.make_context("device-plugin", ["--node-name=n", *args])
    return PluginOptions.from_flags(ctx.params)


def test_the_defaults_the_chart_relies_on() -> None:
    got = options()
    assert got.node == "n"
    assert got.settings.unit is MemoryUnit.GiB
    assert got.cgpu_policy is Policy.NATIVE and got.max_pods is None
    assert got.handoff.strategy is Strategy.CDI_CRI
    assert got.handoff.spec_dirs == (Path("/etc/cdi"), Path("/var/run/cdi"))
    assert got.plugin_dir == Path("/var/lib/kubelet/device-plugins")
    assert got.state_dir == Path("/var/lib/gpushare")
    assert (got.caps.per_pod, got.caps.per_node, got.caps.kept) == (2048, 16384, 16)
    assert got.metrics_port == 9400 and got.metrics.enabled and got.health_port == 0
    assert got.fake_health_file is None and got.used_summary_interval_s == 300.0


def test_flags_are_typed_once() -> None:
    got = options(
        "--gpu-memory-unit=128MiB",
        "--cgpu-policy=2",
        "--max-pods-per-gpu=8",
        "--device-list-strategy=envvar",
        "--cdi-spec-dirs= /a , ,/b",
        "--fake-gpus=2x15GiB",
        "--fake-health-file=/tmp/failed",
        "--mem-resource=",
    )
    assert got.settings.unit is MemoryUnit.MiB128
    assert got.settings.names.mem == "aliyun.com/gpu-mem"  # empty keeps the default
    assert got.cgpu_policy is Policy.WEIGHTED and got.max_pods == 8
    assert got.handoff.strategy is Strategy.ENVVAR
    assert got.handoff.spec_dirs == (Path("/a"), Path("/b"))
    assert got.fake_health_file == Path("/tmp/failed")


def test_bad_values_name_the_flag_the_value_and_the_rule() -> None:
    with pytest.raises(click.BadParameter, match=r"--cgpu-policy .*'9' is not a cGPU policy"):
        options("--cgpu-policy=9")
    with pytest.raises(CommandError, match="--fake-topology describes fake GPUs; give --fake-gpus"):
        options("--fake-topology=pcie")
    with pytest.raises(CommandError, match=r"--broker-idle-timeout=-1 must be 0 \(never\)"):
        options("--broker-idle-timeout=-1")
