"""The device plugin's watch of its node's pods on the real kube-apiserver.

kube.podwatch keeps a node's pods from one field-selected list and then a watch. These tests
run it against the real control plane, on a kwok node, and check that its store ends equal to
what the API server lists for the node, every pod created, changed or deleted meanwhile
included:

- across a kube-apiserver restart (the watch's connection drops; it lists again after the
  backoff's wait);
- across a watch expiry: a watch resumed from a resourceVersion the restarted server's watch
  cache no longer has gets 410 Gone from the real server, and lists again at once;
- through the bookmarks the server sends (about one a minute), which carry no pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpushare.kube.lightkube_api import LightkubeAPI
from gpushare.kube.podwatch import NodePodWatch
from harness.cluster import Cluster
from harness.seeding import kwok_node
from tests.support.e2e import delete_nodes, eventually

NAMESPACE = "default"


def bare_pod(name: str, node: str) -> dict[str, Any]:
    """A pod bound to ``node`` at creation, which kwok runs."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "e2e-watch"}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "busybox"}],
        },
    }


def create(cluster: Cluster, *pods: dict[str, Any]) -> None:
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(pods)})
    cluster.kubectl("create", "-f", "-", input=body)


def truth(cluster: Cluster, node: str) -> dict[str, str]:
    """The node's pods as the API server lists them: UID to resourceVersion."""
    items = cluster.kubectl_json("get", "pods", "-A", "--field-selector", f"spec.nodeName={node}")[
        "items"
    ]
    return {p["metadata"]["uid"]: p["metadata"]["resourceVersion"] for p in items}


class Watching:
    """A NodePodWatch running on its own event loop in a thread, stopped and started at will."""

    def __init__(self, cluster: Cluster, node: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.api = self._call(self._connect(cluster))
        self.watch = NodePodWatch(self.api, node)
        self.task: Any = None

    async def _connect(self, cluster: Cluster) -> LightkubeAPI:
        return LightkubeAPI.connect(str(cluster.kubeconfig))

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(60)

    def start(self) -> None:
        async def begin() -> Any:
            return asyncio.create_task(self.watch.run())

        self.task = self._call(begin())

    def stop(self) -> None:
        async def end() -> None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

        self._call(end())

    def held(self) -> dict[str, str]:
        async def read() -> dict[str, str]:
            return {u: p["metadata"]["resourceVersion"] for u, p in self.watch.pods.items()}

        result: dict[str, str] = self._call(read())
        return result

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()
        self._call(self.api.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()
        gc.collect()  # the connections the restarted server dropped, while warnings are caught


@pytest.fixture
def watched(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[tuple[str, Watching]]:
    node = f"watch-{request.node.name[-20:].replace('_', '-').strip('-')}"
    cluster.create_nodes([kwok_node(node)])
    watching = Watching(cluster, node)
    try:
        yield node, watching
    finally:
        watching.close()
        cluster.kubectl(
            "delete", "pods", "-n", NAMESPACE, "-l", "app=e2e-watch", "--wait=false", check=False
        )
        delete_nodes(cluster, [node])


def start_with_pods(cluster: Cluster, node: str, watching: Watching, *names: str) -> None:
    """Create these pods on the node, start the watch, and wait until it holds them."""
    create(cluster, *(bare_pod(name, node) for name in names))
    watching.start()
    eventually(
        lambda: watching.held() == truth(cluster, node) and len(truth(cluster, node)) == len(names)
    )


def test_the_plugins_watch_survives_an_apiserver_restart_with_no_pod_missed(
    cluster: Cluster, watched: tuple[str, Watching]
) -> None:
    node, watching = watched
    start_with_pods(cluster, node, watching, "before-0", "before-1", "before-2")
    lists = watching.watch.lists

    cluster.restart_apiserver(down_s=2.0)
    # changes right after the server is back, while the watch may still be waiting to list
    create(cluster, *(bare_pod(f"after-{i}", node) for i in range(3)))
    cluster.kubectl("delete", "pod", "-n", NAMESPACE, "before-0", "--wait=false")
    eventually(
        lambda: watching.held() == truth(cluster, node),
        90,
        "the watch's store equal to the API server's list of the node's pods",
    )
    assert watching.watch.lists > lists  # it listed again after the drop
    # and it follows the server again: a later pod arrives by the watch, without a list
    lists = watching.watch.lists
    create(cluster, bare_pod("later", node))
    eventually(lambda: watching.held() == truth(cluster, node) and len(watching.held()) == 6)
    assert watching.watch.lists == lists
    assert watching.watch.current
    # kube-apiserver sends a watch that asked for them a bookmark about once a minute; the
    # watch takes it in (its version moves on) and goes on
    eventually(lambda: watching.watch.bookmarks > 0, 150, "a bookmark")
    create(cluster, bare_pod("after-bookmark", node))
    eventually(lambda: watching.held() == truth(cluster, node) and len(watching.held()) == 7)
    assert watching.watch.lists == lists and not watching.task.done()


def test_the_plugins_watch_lists_again_on_410_gone_with_no_pod_missed(
    cluster: Cluster, watched: tuple[str, Watching]
) -> None:
    node, watching = watched
    start_with_pods(cluster, node, watching, "old-0", "old-1")
    watching.stop()  # a watch that was not connected while what follows happened
    stale = watching.watch.version
    cluster.restart_apiserver()  # its watch cache starts at a newer resourceVersion
    create(cluster, bare_pod("new-0", node))
    cluster.kubectl("delete", "pod", "-n", NAMESPACE, "old-0", "--wait=false")
    gones = watching.watch.gones
    watching.start()  # resumes from ``stale``: the server answers 410
    eventually(
        lambda: watching.watch.gones > gones and watching.held() == truth(cluster, node),
        60,
        f"410 Gone for resourceVersion {stale} and a store equal to the API server's",
    )
    started = time.monotonic()
    create(cluster, bare_pod("new-1", node))
    eventually(lambda: watching.held() == truth(cluster, node))
    assert time.monotonic() - started < 30
