"""The released kubectl plugin file, run against the real control plane as a laptop runs it.

packaging/release.py makes this machine's plugin file the way a release does (the kube-gpushare
wheel built from this checkout, the plugin's wheels for Linux from PyPI, one zipapp); the test
puts it on a PATH that holds only it, kubectl and the system's directories, so the system's
``python3`` runs it with nothing of this checkout importable, and compares what it shows with
the checkout's own ``kubectl inspect cgpu``. macOS and Windows files are built by the same code
(tests/integration/packaging/test_release.py checks what can be checked of them here).
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from gpushare.core.model.inventory import Mode
from harness.cluster import Cluster
from harness.helpers import apply_all, gpu_pod_manifest, pods
from harness.image_archive import project_version
from harness.seeding import labelled_kwok_nodes
from tests.support.e2e import create_nodes, delete_nodes, eventually

REPO = Path(__file__).resolve().parents[2]
NODE, NAMESPACE = "artifact-0", "artifact-view"


def _release() -> ModuleType:
    sys.path.insert(0, str(REPO / "packaging"))
    try:
        return importlib.import_module("release")
    finally:
        sys.path.remove(str(REPO / "packaging"))


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    system_python = shutil.which("python3", path="/usr/bin:/bin")
    if system_python is None or platform.machine() not in ("x86_64", "aarch64"):
        pytest.skip("no system python3 here, or a machine the plugin is not built for")
    release = _release()
    work = tmp_path_factory.mktemp("plugin")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(work), "."],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = work.glob("kube_gpushare-*.whl")
    arch = {"x86_64": "amd64", "aarch64": "arm64"}[platform.machine()]
    (target,) = [p for p in release.PLUGIN_PLATFORMS if (p.os, p.arch) == ("linux", arch)]
    data = release.plugin(wheel, target, project_version(), work / "download", sys.executable)
    bin_dir = work / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl-inspect-cgpu").write_bytes(data)
    (bin_dir / "kubectl-inspect-cgpu").chmod(0o755)
    return bin_dir


def test_the_release_file_shows_what_the_checkout_shows(
    cluster: Cluster, plugin_dir: Path, tmp_path: Path
) -> None:
    create_nodes(
        cluster, labelled_kwok_nodes([NODE], "artifact", gpus_units=[15, 15], mode=Mode.SHARE)
    )
    cluster.create_namespace(NAMESPACE)
    try:
        apply_all(
            cluster,
            [gpu_pod_manifest("train", NAMESPACE, 3, selector={"gpushare-e2e": "artifact"})],
        )
        eventually(
            lambda: all(p["spec"].get("nodeName") == NODE for p in pods(cluster, NAMESPACE)),
            90,
            "the pod bound",
        )
        env = {
            "PATH": os.pathsep.join(
                [str(plugin_dir), str(cluster.binaries["kubectl"].parent), "/usr/bin", "/bin"]
            ),
            "KUBECONFIG": str(cluster.kubeconfig),
            "HOME": str(tmp_path),
            "XDG_CACHE_HOME": str(tmp_path / "cache"),
        }
        args = ["inspect", "cgpu", "-n", NAMESPACE, "-o", "json"]
        released = subprocess.run(
            [str(cluster.binaries["kubectl"]), *args],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        print(released.stdout + released.stderr)
        assert released.returncode == 0, released.stderr
        # the system's Python ran it, from what the file carries
        unpacked = list((tmp_path / "cache" / "kubectl-inspect-cgpu").iterdir())
        assert len(unpacked) == 1 and (unpacked[0] / "site" / "gpushare" / "inspect").is_dir()
        checkout = cluster.kubectl(*args).stdout
        assert json.loads(released.stdout) == json.loads(checkout)
        nodes = json.loads(released.stdout)["nodes"]
        assert [p["name"] for n in nodes for p in n["pods"]] == ["train"]
        table = subprocess.run(
            [str(cluster.binaries["kubectl"]), "inspect", "cgpu", "-n", NAMESPACE, "-d"],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        print(table.stdout)
        assert table.returncode == 0 and "train" in table.stdout
    finally:
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
        delete_nodes(cluster, [NODE])
