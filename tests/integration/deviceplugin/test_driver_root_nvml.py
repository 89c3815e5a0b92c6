"""NVML loaded from a driver root, as on GKE's Container-Optimized OS (issue 59, PLATFORMS.md G2).

The fake NVML (harness/fakegpu/fakes/fake_nvml.c) is compiled as ``lib64/libnvidia-ml.so.1``
of a temporary driver root, GKE's layout. The plugin reads the GPUs from there with no
``LD_LIBRARY_PATH``; without ``--driver-root`` it refuses with the message users see today. Each
run is its own process: pynvml keeps the library it loaded for the life of a process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpushare.isolation import build

ROOT = Path(__file__).resolve().parents[3]
FAKE_NVML = ROOT / "harness" / "fakegpu" / "fakes" / "fake_nvml.c"

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

READ = """
import json, sys
from pathlib import Path
from gpushare.node.driverroot import DriverRoot
from gpushare.node.gpus import NvmlGpus
gpus = NvmlGpus(DriverRoot(Path(sys.argv[1]))).gpus()
print(json.dumps([[g.index, g.uuid, g.minor, g.memory_mib] for g in gpus]))
"""


def driver_root(tmp_path: Path, lib_dir: str = "lib64") -> Path:
    """A driver root holding the fake NVML under ``lib_dir``, by NVML's soname."""
    root = tmp_path / "nvidia"
    build.compile_shared(
        [FAKE_NVML],
        root / lib_dir / "libnvidia-ml.so.1",
        extra=("-Wl,-soname,libnvidia-ml.so.1",),
        libs=("-ldl",),
    )
    return root


def env(**extra: str) -> dict[str, str]:
    """The environment of a plugin with no loader path to any NVML."""
    kept = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    return {**kept, "PYTHONPATH": str(ROOT / "src"), **extra}


def plugin(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """``gpushare device-plugin`` until it has read the GPUs (it stops at the API server)."""
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "from gpushare.cli import main; main()",
            "device-plugin",
            "--node-name=n1",
            "--insecure-no-seal",
            "--isolation=none",
            f"--state-dir={tmp_path / 'state'}",
            f"--kubeconfig={tmp_path / 'no-kubeconfig'}",
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(),
    )


@pytest.mark.parametrize("lib_dir", ["lib64", "lib", "lib/x86_64-linux-gnu"])
def test_nvml_is_read_from_the_driver_root_without_a_loader_path(
    tmp_path: Path, lib_dir: str
) -> None:
    root = driver_root(tmp_path, lib_dir)
    done = subprocess.run(
        [sys.executable, "-c", READ, str(root)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(FAKE_GPU_UUIDS="GPU-11111111-0000-4000-8000-000000000000,GPU-22"),
        check=True,
    )
    assert json.loads(done.stdout) == [
        [0, "GPU-11111111-0000-4000-8000-000000000000", 0, 16384],
        [1, "GPU-22", 1, 16384],
    ]


def test_the_plugin_reads_nvml_only_with_the_driver_root(tmp_path: Path) -> None:
    """Before: the refusal users see on COS. After: the GPUs, read from the driver root."""
    root = driver_root(tmp_path)
    before = plugin(tmp_path)
    assert before.returncode != 0
    assert "cannot read GPUs through NVML (NVMLError_LibraryNotFound" in before.stderr
    assert "devicePlugin.deviceListStrategy=driver-root" in before.stderr  # the hint added
    after = plugin(tmp_path, f"--driver-root={root}")
    assert "cannot read GPUs through NVML" not in after.stderr
    assert f"library={root}/lib64/libnvidia-ml.so.1" in after.stderr
    # the next step, the API client, is what stops it here
    assert "cannot load a kubeconfig" in after.stderr


def test_a_driver_root_without_nvml_is_refused_naming_every_path_tried(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    done = plugin(tmp_path, f"--driver-root={tmp_path / 'empty'}")
    assert done.returncode != 0
    tried = ", ".join(
        f"{tmp_path}/empty/{d}/libnvidia-ml.so.1" for d in ("lib64", "lib", "lib/x86_64-linux-gnu")
    )
    assert f"no libnvidia-ml.so.1 (tried {tried})" in done.stderr
    assert "devicePlugin.driverRoot.hostPath" in done.stderr


def test_driver_root_strategy_without_the_directory_is_refused_naming_the_value(
    tmp_path: Path,
) -> None:
    done = plugin(tmp_path, "--device-list-strategy=driver-root")
    assert done.returncode != 0
    assert "--device-list-strategy driver-root needs --driver-root" in done.stderr
    assert "devicePlugin.driverRoot.hostPath" in done.stderr
