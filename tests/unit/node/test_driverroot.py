"""The driver-root hand-off's pure parts: the answer's device nodes and mount, the refusals, and
the flags (GKE's plugin's contract, container-engine-accelerators; docs/driver-root.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpushare.cli import main as gpushare
from gpushare.node.cdi import VOID, HandOff, Strategy, parse_strategy
from gpushare.node.driverroot import DriverRoot, DriverRootError


def root_with(tmp_path: Path, *nodes: str) -> DriverRoot:
    (tmp_path / "nvidia").mkdir()
    (tmp_path / "dev").mkdir()
    for name in nodes:
        (tmp_path / "dev" / name).touch()
    return DriverRoot(tmp_path / "nvidia", dev_root=tmp_path / "dev")


def test_driver_root_is_a_strategy() -> None:
    assert parse_strategy("driver-root") is Strategy.DRIVER_ROOT


def test_the_answer_names_the_gpus_by_minor_and_the_shared_nodes_the_host_has(
    tmp_path: Path,
) -> None:
    root = root_with(tmp_path, "nvidia3", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
    handoff = HandOff(Strategy.DRIVER_ROOT, driver_root=root)
    devices, mounts = handoff.host_edits([3], carries_devices=True)
    dev = tmp_path / "dev"
    assert devices == (
        ("/dev/nvidia3", f"{dev}/nvidia3", "mrw"),
        ("/dev/nvidiactl", f"{dev}/nvidiactl", "mrw"),
        ("/dev/nvidia-uvm", f"{dev}/nvidia-uvm", "mrw"),
        ("/dev/nvidia-uvm-tools", f"{dev}/nvidia-uvm-tools", "mrw"),
    )
    assert mounts == (("/usr/local/nvidia", str(tmp_path / "nvidia"), True),)
    assert handoff.answer(["GPU-a"], carries_devices=True) == (VOID, ())
    assert handoff.host_edits([3], carries_devices=False) == ((), ())


def test_other_strategies_add_no_device_node_or_mount(tmp_path: Path) -> None:
    root = root_with(tmp_path, "nvidia0")
    for strategy in (Strategy.ENVVAR, Strategy.CDI_CRI):
        assert HandOff(strategy, driver_root=root).host_edits([0], carries_devices=True) == (
            (),
            (),
        )


def test_a_missing_device_node_or_minor_is_refused_with_the_gpu(tmp_path: Path) -> None:
    root = root_with(tmp_path, "nvidia0", "nvidiactl")
    handoff = HandOff(Strategy.DRIVER_ROOT, driver_root=root)
    assert handoff.refusal(["GPU-a"], [0]) is None
    missing = handoff.refusal(["GPU-a", "GPU-b"], [0, 1])
    assert missing is not None
    assert f"no device node for GPU(s) GPU-b ({tmp_path}/dev/nvidia1)" in missing
    unknown = handoff.refusal(["GPU-a"], [None])
    assert unknown is not None and "NVML gave no minor number for GPU(s) GPU-a" in unknown
    gone = HandOff(Strategy.DRIVER_ROOT, driver_root=DriverRoot(tmp_path / "none"))
    refused = gone.refusal(["GPU-a"], [0])
    assert refused is not None and f"the driver root {tmp_path}/none is not a directory" in refused


def test_nvml_is_looked_for_in_gke_s_layout_first(tmp_path: Path) -> None:
    root = DriverRoot(tmp_path)
    for lib in ("lib/x86_64-linux-gnu", "lib64"):
        (tmp_path / lib).mkdir(parents=True)
        (tmp_path / lib / "libnvidia-ml.so.1").touch()
    assert root.nvml_library() == tmp_path / "lib64" / "libnvidia-ml.so.1"
    with pytest.raises(DriverRootError, match=r"no libnvidia-ml\.so\.1 \(tried .*/lib64/"):
        DriverRoot(tmp_path / "empty").nvml_library()


@pytest.mark.parametrize(
    ("flags", "expect"),
    [
        (
            ["--device-list-strategy=driver-root"],
            "--device-list-strategy driver-root needs --driver-root",
        ),
        (["--driver-root=home/kubernetes/bin/nvidia"], "--driver-root='home/kubernetes/bin/nvidia"),
        (
            ["--driver-root=/x", "--driver-root-container-path=usr/local/nvidia"],
            "--driver-root-container-path='usr/local/nvidia' is not an absolute path",
        ),
        (["--driver-root=/x", "--dev-root=dev"], "--dev-root='dev' is not an absolute path"),
    ],
)
def test_bad_driver_root_flags_are_refused_before_the_node_is_read(
    flags: list[str], expect: str
) -> None:
    done = CliRunner().invoke(gpushare, ["device-plugin", "--node-name=n", *flags])
    assert done.exit_code == 2
    assert expect in done.output
