"""``gpushare demo``: the seed walkthrough in one process.

An in-memory API server, the real extender app (over ASGI, no sockets), a kube-scheduler-like
driver, and the ``kubectl inspect cgpu`` renderer: the same code that runs in a cluster.
"""

from __future__ import annotations

import asyncio
import json
from importlib import resources
from typing import Any

import httpx
import yaml
from rich.console import Console

from gpushare.core.names import ANN_ALLOCATION, ANN_IDX
from gpushare.core.scheduling import Scheduler, Settings
from gpushare.extender.app import create_app
from gpushare.extender.driver import ExtenderDriver, Outcome
from gpushare.extender.service import Extender
from gpushare.inspect.cli import collect, render
from gpushare.kube.cache import ClusterCache
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod, pod_from_job

SHARE_NODE = "cn-zhangjiakou.192.168.66.139"
CORE_NODE = "cn-zhangjiakou.192.168.66.140"


def example(name: str) -> dict[str, Any]:
    """Load one of the packaged example manifests."""
    text = resources.files("gpushare.examples").joinpath(name).read_text()
    loaded = yaml.safe_load(text)
    assert isinstance(loaded, dict)
    return loaded


class Demo:
    """Holds the in-process cluster and prints each step."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.kube = MemoryKube()
        settings = Settings()
        scheduler = Scheduler(settings)
        self.cache = ClusterCache(self.kube, settings=settings, workload=scheduler.workload)
        self.extender = Extender(api=self.kube, cache=self.cache, scheduler=scheduler)
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(self.extender)),
            base_url="http://gpushare-extender",
        )
        self.driver = ExtenderDriver(self.client)

    async def settle(self) -> None:
        """Let the cache's watches catch up with the in-memory API."""
        for _ in range(50):
            await asyncio.sleep(0)

    def step(self, title: str) -> None:
        self.console.rule(f"[bold]{title}")

    def shell(self, command: str) -> None:
        self.console.print(f"$ {command}", style="cyan", highlight=False, soft_wrap=True)

    def plain(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False, end="", soft_wrap=True)

    async def inspect(self, *, details: bool = False) -> None:
        await self.settle()
        self.shell("kubectl inspect cgpu" + (" -d" if details else ""))
        self.plain(render(await collect(self.kube), details=details, output="text"))
        self.console.print()

    async def submit(self, pod: dict[str, Any]) -> Outcome:
        stored = self.kube.create_pod(pod)
        await self.settle()
        outcome = await self.driver.schedule(
            stored, [n["metadata"]["name"] for n in self.kube.nodes()]
        )
        await self.settle()
        return outcome

    async def run(self) -> None:
        task = asyncio.create_task(self.cache.run())
        try:
            await self._walkthrough()
        finally:
            task.cancel()
            await self.client.aclose()

    async def _walkthrough(self) -> None:
        self.step("1. Shared GPU scheduling: the seed walkthrough")
        self.shell(f"kubectl label node {SHARE_NODE} ack.node.gpu.schedule=share")
        self.kube.put_node(gpu_node(SHARE_NODE, ip="192.168.66.139", gpus_units=[15]))
        await self.inspect()
        job = example("GPUtest.yaml")
        self.shell("kubectl apply -f examples/GPUtest.yaml")
        self.plain(f"job.batch/{job['metadata']['name']} created\n")
        self.report(await self.submit(pod_from_job(job)))
        await self.inspect()

        self.step("2. Computing power: a core_mem node with 4 GPUs x 15 GiB")
        self.kube.put_node(
            gpu_node(
                CORE_NODE,
                ip="192.168.66.140",
                gpus_units=[15] * 4,
                mode="core_mem",
                placement="binpack",
            )
        )
        self.shell(f"kubectl get node {CORE_NODE} -o yaml   # capacity and allocatable")
        status = next(n for n in self.kube.nodes() if n["metadata"]["name"] == CORE_NODE)["status"]
        shown = {
            key: {k: v for k, v in sorted(status[key].items()) if k.startswith("aliyun.com/")}
            for key in ("allocatable", "capacity")
        }
        self.plain(yaml.safe_dump({"status": shown}, sort_keys=False))
        self.shell("kubectl apply -f examples/cuda-sample.yaml")
        self.report(await self.submit(pod_from_job(example("cuda-sample.yaml"))))
        await self.inspect(details=True)

        self.step("3. Pods that cannot be placed, and why")
        refused = [
            gpu_pod("too-big", mem=16),
            gpu_pod("no-room", mem=13),
            gpu_pod("suffixed", mem="3Gi"),
            gpu_pod("odd-core", mem=2, core=33),
            gpu_pod("uneven", mem=3, gpu_count="2"),
        ]
        for pod in refused:
            limits = pod["spec"]["containers"][0]["resources"]["limits"]
            labels = pod["metadata"]["labels"]
            self.shell(
                f"kubectl describe pod {pod['metadata']['name']}   # limits {json.dumps(limits)}"
                + (f" labels {json.dumps(labels)}" if labels else "")
            )
            self.report(await self.submit(pod))
        await self.inspect()

    def report(self, outcome: Outcome) -> None:
        total = len(self.kube.nodes())
        if outcome.bound:
            pod = next(
                p
                for p in self.kube.pods()
                if f"{p['metadata']['namespace']}/{p['metadata']['name']}" == outcome.pod
            )
            annotations = pod["metadata"].get("annotations", {})
            self.plain(
                f"  Normal   Scheduled  ack-co-scheduler  {outcome.event(total)} "
                f"(GPU {annotations.get(ANN_IDX)})\n"
            )
            self.plain(f"  annotation {ANN_ALLOCATION}: {annotations.get(ANN_ALLOCATION)}\n")
        else:
            self.plain(f"  Warning  FailedScheduling  ack-co-scheduler  {outcome.event(total)}\n")
            if len(set(outcome.failed.values())) > 1:
                for node, reason in sorted(outcome.failed.items()):
                    self.plain(f"    {node}: {reason}\n")


def run_demo(console: Console | None = None) -> None:
    """Run the walkthrough and print it."""
    asyncio.run(Demo(console or Console()).run())
