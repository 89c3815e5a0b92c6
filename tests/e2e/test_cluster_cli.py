"""``make cluster`` as a person runs it: ``up`` with the 128 MiB unit, the seed example, ``down``.

``up`` and ``down`` run as their own processes (the entry ``make cluster`` calls), so the
components outlive ``up`` exactly as they do for a person, and ``down`` finds them with no pids
file to help: the test deletes it first. A leftover ``etcd`` of the directory, which no pids file
names, must be stopped by ``up`` before it starts anew.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness.cluster import Cluster, build_binaries
from harness.reaping import find_running
from harness.seeding import CORE_NODE, SHARE_NODE
from tests.support.e2e import REPO, eventually


def cluster_command(*args: str, timeout: float = 240) -> str:
    """``python -m harness.clusterctl ARGS`` from the repository; its output, checked."""
    result = subprocess.run(
        [sys.executable, "-m", "harness.clusterctl", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = result.stdout + result.stderr
    print(output)
    assert result.returncode == 0, output
    return output


def leftover_etcd(root: Path) -> subprocess.Popen[bytes]:
    """A process that looks like an etcd of ``root`` (name and data dir), recorded nowhere."""
    script = "import time; time.sleep(600)"
    return subprocess.Popen(
        ["bash", "-c", f'exec -a etcd "{sys.executable}" -c "{script}" --data-dir {root}/etcd'],
        start_new_session=True,
    )


def bound(cluster: Cluster, selector: str) -> dict[str, Any] | None:
    items = cluster.kubectl_json("get", "pods", "-l", selector)["items"]
    placed = [p for p in items if p["spec"].get("nodeName")]
    return placed[0] if placed else None


def test_up_seeds_the_nodes_and_down_stops_everything(tmp_path: Path) -> None:
    root = tmp_path / "cluster"
    (root / "etcd").mkdir(parents=True)
    stray = leftover_etcd(root)
    eventually(lambda: find_running(root), 10, "the leftover etcd to show")
    try:
        out = cluster_command("up", "--dir", str(root), "--unit", "128MiB")
        stray.wait(timeout=10)
        assert f"stopped etcd (pid {stray.pid})" in out
        assert f"export KUBECONFIG={root / 'admin.kubeconfig'}" in out
        assert "gpuMemoryUnit 128MiB" in out
        cluster = Cluster(root=root, binaries=build_binaries())

        nodes = {n["metadata"]["name"]: n for n in cluster.kubectl_json("get", "nodes")["items"]}
        assert set(nodes) == {SHARE_NODE, CORE_NODE}
        share, core = nodes[SHARE_NODE], nodes[CORE_NODE]
        assert share["metadata"]["labels"]["ack.node.gpu.schedule"] == "share"
        assert share["metadata"]["annotations"]["gpushare.io/gpu-mem-unit"] == "128MiB"
        assert share["status"]["allocatable"]["aliyun.com/gpu-mem"] == "120"  # 15 GiB
        assert core["metadata"]["labels"]["ack.node.gpu.schedule"] == "core_mem"
        assert core["status"]["allocatable"]["aliyun.com/gpu-mem"] == "480"
        assert core["status"]["allocatable"]["aliyun.com/gpu-core.percentage"] == "400"

        cluster.kubectl("apply", "-f", str(REPO / "examples" / "binpack-128mib.yaml"))
        pod = eventually(lambda: bound(cluster, "app=binpack-1"), 60, "binpack-0 bound")
        assert pod["spec"]["nodeName"] == SHARE_NODE  # core_mem takes no memory-only pods
        record = json.loads(pod["metadata"]["annotations"]["gpushare.io/allocation"])
        assert record["gpus"] == [{"index": 0, "mem": 16, "core": 0}]  # 16 x 128 MiB
        inspect = cluster.kubectl("inspect", "cgpu")
        print(inspect.stdout, inspect.stderr)
        assert f"{SHARE_NODE}  192.168.66.139  2048/15360" in inspect.stdout
        assert not inspect.stderr  # the seal key is read from the Secret `up` made
    finally:
        if stray.poll() is None:  # `up` failed before stopping it: never leave it running
            stray.kill()
        stray.wait(timeout=10)
        running = find_running(root)
        (root / "pids").unlink(missing_ok=True)
        out = cluster_command("down", "--dir", str(root), timeout=120)
    assert running and all(f"stopped {p.component} (pid {p.pid})" in out for p in running)
    assert {p.component for p in running} >= {
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "gpushare-extender",
        "kwok",
    }
    assert find_running(root) == []
    assert "no process of the cluster" in cluster_command("down", "--dir", str(root))
