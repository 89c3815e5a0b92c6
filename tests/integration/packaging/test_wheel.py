"""``pip wheel .`` from a clean checkout gives a working package.

The build backend (packaging/gpushare_build.py) generates what git does not keep: without it the
wheel would lack the gRPC stubs the device plugin imports and the interposer cgpu nodes preload.
The runtime requirements leave the simulator's extra out, so the image stays small.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _clean_checkout(dest: Path) -> None:
    """The tracked and untracked-but-not-ignored files, without any build output."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    for name in listed:
        source = ROOT / name
        if not source.is_file() or "api_pb2" in name or name.endswith(".so"):
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def test_pip_wheel_from_a_clean_checkout_carries_stubs_and_interposer(tmp_path: Path) -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    if shutil.which("gcc") is None:
        pytest.skip("no gcc: the interposer cannot be built here")
    checkout = tmp_path / "checkout"
    _clean_checkout(checkout)
    assert not list(checkout.rglob("api_pb2*")), "the copy must start without stubs"
    # A fresh interpreter without grpcio-tools, as on a machine that only has Python: pip's
    # build environment alone must provide what the backend runs.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    assert subprocess.run([python, "-c", "import grpc_tools"], check=False).returncode != 0
    result = subprocess.run(
        [python, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), "."],
        cwd=checkout,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = tmp_path.glob("kube_gpushare-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
        requires = [
            line.split(":", 1)[1].strip()
            for line in archive.read(metadata).decode().splitlines()
            if line.startswith("Requires-Dist:")
        ]
    for stub in ("v1beta1/api_pb2.py", "v1beta1/api_pb2_grpc.py", "podresources_v1/api_pb2.py"):
        assert f"gpushare/deviceplugin/kubelet/protos/{stub}" in names
    for stub in ("dra_v1/api_pb2_grpc.py", "pluginregistration_v1/api_pb2_grpc.py"):
        assert f"gpushare/dra/protos/{stub}" in names
    assert "gpushare/isolation/native/libgpushare-cuda.so" in names
    runtime = [r for r in requires if "extra ==" not in r]
    assert not [r for r in runtime if r.split("==")[0].lower() in {"numpy", "matplotlib"}]
    assert any(r.startswith("numpy") and 'extra == "sim"' in r for r in requires)
