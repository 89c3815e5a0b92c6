"""End-to-end fixtures and helpers: one real control plane per test session.

These tests run only with ``GPUSHARE_E2E=1`` (``make e2e`` and ``make test`` set it), because
they build and start the upstream binaries; plain ``pytest`` skips them. ``tests/e2e/conftest.py``
imports the fixtures and the hook; the tests import the helpers.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.autoscalers import CA_BINARY, build_autoscalers
from harness.autoscalers import unavailable as autoscaler_unavailable
from harness.cluster import Cluster, running_cluster
from harness.realnode import RealNode, unavailable

ENABLED = os.environ.get("GPUSHARE_E2E") == "1"
REPO = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The scale run leaves thousands of pods being deleted behind it: run it last.
    items.sort(key=lambda item: "test_scale" in str(item.fspath))
    skip = pytest.mark.skip(reason="end-to-end: set GPUSHARE_E2E=1 (make e2e) to run")
    for item in items:
        if "tests/e2e/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.e2e)
            if not ENABLED:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("cluster")
    started = time.monotonic()
    with running_cluster(root, progress=lambda s: print(f"[e2e] starting {s}", flush=True)) as c:
        print(f"[e2e] control plane up in {time.monotonic() - started:.1f}s", flush=True)
        yield c


REAL_NODE_LOCK = "/tmp/gpushare-real-node.lock"


@pytest.fixture(scope="module")
def real_node(cluster: Cluster) -> Iterator[RealNode]:
    """One kubelet-backed node with containerd and the device plugin, for a test module.

    Module scope (it starts in about 6 s): the node and its GPUs are gone again before the kwok
    tests that count every node's GPUs, such as the seed walkthrough.

    Where it cannot run (no root, packages missing) its tests skip, except under CI, where a
    missing real node is a failure rather than a silent skip.
    """
    yield from hold_real_node(cluster)


def hold_real_node(cluster: Cluster, **options: Any) -> Iterator[RealNode]:
    """Start a :class:`RealNode` with ``options`` once this machine's real node is free; stop it
    after. Skips (fails under CI) where a real node cannot run."""
    reason = unavailable()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"real node unavailable in CI: {reason}")
        pytest.skip(f"real node unavailable: {reason}")
    waited = time.monotonic()
    with open(REAL_NODE_LOCK, "w") as lock:
        # One kubelet per machine (its cgroups, /var/lib/kubelet and the plugin sockets are
        # the host's): a second test session waits here instead of breaking the first.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if time.monotonic() - waited > 1:
            print(f"[e2e] waited {time.monotonic() - waited:.0f}s for the real node", flush=True)
        yield from _real_node(cluster, **options)


def _real_node(cluster: Cluster, **options: Any) -> Iterator[RealNode]:
    started = time.monotonic()
    node = RealNode(cluster=cluster, root=cluster.root / "realnode", **options)
    node.start(progress=lambda s: print(f"[e2e] starting {s}", flush=True))
    print(f"[e2e] real node up in {time.monotonic() - started:.1f}s", flush=True)
    try:
        yield node
    finally:
        node.stop()
        if cluster.extender_unit != "1GiB":  # the tests after these count in GiB
            cluster.start_extender(unit="1GiB")


def cluster_autoscaler_binaries() -> dict[str, Path]:
    """The autoscalers' binaries (``harness.autoscalers.build_autoscalers``), skipping the test
    with the reason where cluster-autoscaler cannot run here."""
    binaries = build_autoscalers()
    reason = autoscaler_unavailable(binaries, CA_BINARY)
    if reason:
        pytest.skip(reason)
    return binaries


def kubectl_inspect(
    cluster: Cluster, *args: str, config: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``kubectl inspect cgpu`` with ``args``, as the admin or as ``config``'s user, printed for
    the log; the plugin never ends in a traceback, whoever runs it."""
    env = cluster.env()
    if config is not None:
        env = {**env, "KUBECONFIG": str(config)}
    result = subprocess.run(
        [str(cluster.binaries["kubectl"]), "inspect", "cgpu", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    print(f"$ kubectl inspect cgpu {' '.join(args)}  (exit {result.returncode})")
    print(result.stdout + result.stderr)
    assert "Traceback" not in result.stderr
    return result


def eventually(check: Callable[[], Any], timeout: float = 60, what: str = "") -> Any:
    """Poll until ``check`` returns something truthy; return it."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or check}: last={last!r}")


def create_nodes(cluster: Cluster, nodes: list[dict[str, Any]]) -> None:
    """kubectl apply the nodes and wait until kwok reports them Ready."""
    cluster.create_nodes(nodes)


def delete_nodes(cluster: Cluster, names: list[str]) -> None:
    cluster.kubectl("delete", "node", *names, "--wait=false", check=False)


CHART = Path(__file__).resolve().parents[2] / "charts" / "gpushare"


def helm(cluster: Cluster, *args: str, check: bool = True) -> Any:

    result = subprocess.run(
        [str(cluster.binaries["helm"]), *args],
        env={
            **cluster.env(),
            "HELM_CACHE_HOME": str(cluster.root / "helm" / "cache"),
            "HELM_CONFIG_HOME": str(cluster.root / "helm" / "config"),
            "HELM_DATA_HOME": str(cluster.root / "helm" / "data"),
        },
        capture_output=True,
        text=True,
        timeout=180,
    )
    if check:
        assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result
