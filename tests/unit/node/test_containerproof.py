"""``gpushare check-hand-off``'s decision: what a GPU container must hold of the hand-off."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpushare.cli import main as gpushare
from gpushare.node.containerproof import check

CDI_ENV = {
    "NVIDIA_VISIBLE_DEVICES": "void",
    "ALIYUN_COM_GPU_MEM_IDX": "1",
    "ALIYUN_COM_GPU_MEM_CONTAINER": "1",
    "GPUSHARE_MEM_UNIT": "1GiB",
    "GPUSHARE_MODE": "share",
}


def test_the_nodes_of_the_placed_gpus_and_the_control_node_pass() -> None:
    seen = check(CDI_ENV, ["/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"])
    assert seen.ok
    assert seen.lines == (
        "placed GPU(s) 1, 1 unit(s) of 1GiB (mode share, strategy cdi-cri)",
        "ok   device nodes /dev/nvidia1",
        "ok   /dev/nvidiactl",
        "hand-off ok",
    )


def test_no_device_node_fails_with_the_cdi_cause() -> None:
    seen = check(CDI_ENV, ["/dev/nvidiactl"])
    assert not seen.ok
    assert "FAIL 1 GPU device node(s) expected (/dev/nvidia1), 0 found" in seen.text()
    assert "likely cause (cdi-cri): " in seen.text() and "enable_cdi = false" in seen.text()


def test_envvar_names_the_runtime_class_and_the_toolkit_switch() -> None:
    env = {**CDI_ENV, "NVIDIA_VISIBLE_DEVICES": "GPU-0000"}
    seen = check(env, [])
    assert not seen.ok
    assert "FAIL no /dev/nvidiactl" in seen.text()
    assert "runtimeClassName" in seen.text() and "when-unprivileged = false" in seen.text()


def test_fake_gpus_have_no_control_node() -> None:
    assert check(CDI_ENV, ["/dev/nvidia1"], control=False).ok


def test_a_node_of_another_minor_counts_and_an_extra_gpu_fails() -> None:
    assert check(CDI_ENV, ["/dev/nvidia3", "/dev/nvidiactl"]).ok
    seen = check(CDI_ENV, ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"])
    assert not seen.ok and "sees GPUs it was not given" in seen.text()


def test_isolation_promises_the_limits_file() -> None:
    env = {**CDI_ENV, "GPUSHARE_MEM_LIMIT": "1073741824"}
    assert check(env, ["/dev/nvidia1", "/dev/nvidiactl", "/etc/gpushare/limits"]).ok
    seen = check(env, ["/dev/nvidia1", "/dev/nvidiactl"])
    assert not seen.ok and "FAIL no /etc/gpushare/limits" in seen.text()


def test_a_container_the_plugin_never_answered() -> None:
    seen = check({"NVIDIA_VISIBLE_DEVICES": "all"}, ["/dev/nvidia0"])
    assert not seen.ok and "no ALIYUN_COM_GPU_MEM_IDX" in seen.lines[0]


def test_the_command_lists_the_device_nodes_and_exits_by_the_outcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in CDI_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("GPUSHARE_MEM_LIMIT", raising=False)
    (tmp_path / "nvidia1").touch()
    (tmp_path / "nvidia-uvm").touch()
    runner = CliRunner()
    passed = runner.invoke(
        gpushare, ["check-hand-off", "--dev", str(tmp_path), "--no-control-device"]
    )
    assert passed.exit_code == 0 and passed.output.endswith("hand-off ok\n"), passed.output
    failed = runner.invoke(gpushare, ["check-hand-off", "--dev", str(tmp_path)])
    assert failed.exit_code == 1 and "FAIL no /dev/nvidiactl" in failed.output
