"""``gpushare demo``: the seed walkthrough in one process.

An in-memory API server, the real extender app (over ASGI, no sockets), a kube-scheduler-like
driver, the admission decision, and the ``kubectl inspect cgpu`` renderer: the same code that
runs in a cluster. It prints only what a cluster with the chart installed prints: kubectl's
replies, the events ``kubectl describe pod`` lists (kube-scheduler's, in its v1.36 wording,
``extender.driver``, and the ones gpushare's extender wrote into the in-memory API), and the
webhook's refusal of a request gpushare cannot place, at ``kubectl apply``.
"""

from __future__ import annotations

import asyncio
import json
from importlib import resources
from typing import Any

import httpx
import yaml
from rich.console import Console

from gpushare.core.admitting.admission import API_VERSION as ADMISSION_API
from gpushare.core.admitting.admission import decide
from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.core.model.inventory import Mode
from gpushare.core.model.names import ANN_ALLOCATION
from gpushare.extender.app import create_app
from gpushare.extender.driver import ExtenderDriver, Outcome
from gpushare.extender.service import Extender
from gpushare.inspect.cli import collect, render
from gpushare.kube.cache import ClusterCache
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod, pod_from_job
from gpushare.webhook.configuration import WEBHOOK_NAME

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
        task = asyncio.create_task(self.cache.run(self.extender.take))
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
        await self.report(await self.submit(pod_from_job(job)))
        await self.inspect()

        self.step("2. Computing power: a core_mem node with 4 GPUs x 15 GiB")
        self.kube.put_node(
            gpu_node(
                CORE_NODE,
                ip="192.168.66.140",
                gpus_units=[15] * 4,
                mode=Mode.CORE_MEM,
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
        cuda = example("cuda-sample.yaml")
        self.shell("kubectl apply -f examples/cuda-sample.yaml")
        self.plain(f"job.batch/{cuda['metadata']['name']} created\n")
        await self.report(await self.submit(pod_from_job(cuda)))
        await self.inspect(details=True)

        self.step("3. Pods that cannot be placed, and why")
        for pod in (gpu_pod("too-big", mem=16), gpu_pod("no-room", mem=13)):
            name = pod["metadata"]["name"]
            limits = pod["spec"]["containers"][0]["resources"]["limits"]
            self.shell(f"kubectl apply -f {name}.yaml   # limits {json.dumps(limits)}")
            self.plain(f"pod/{name} created\n")
            await self.report(await self.submit(pod))
        for pod in (
            gpu_pod("suffixed", mem="3Gi"),
            gpu_pod("odd-core", mem=2, core=33),
            gpu_pod("uneven", mem=3, gpu_count="2"),
        ):
            self.refuse(pod)
        await self.inspect()

    def refuse(self, pod: dict[str, Any]) -> None:
        """``kubectl apply`` of a pod the validating webhook refuses, and kubectl's reply."""
        name = pod["metadata"]["name"]
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        labels = pod["metadata"]["labels"]
        self.shell(
            f"kubectl apply -f {name}.yaml   # limits {json.dumps(limits)}"
            + (f" labels {json.dumps(labels)}" if labels else "")
        )
        # the API server stores quantities as strings before the webhook sees them
        stored = {k: str(v) for k, v in limits.items()}
        container = {**pod["spec"]["containers"][0], "resources": {"limits": stored}}
        pod = {
            **pod,
            "metadata": {**pod["metadata"], "namespace": "default"},
            "spec": {**pod["spec"], "containers": [container]},
        }
        request = {
            "uid": f"demo-{name}",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": name,
            "namespace": "default",
            "operation": "CREATE",
            "userInfo": {"username": "kubernetes-admin"},
            "object": pod,
        }
        decision = decide(
            {"apiVersion": ADMISSION_API, "kind": "AdmissionReview", "request": request}
        )
        if decision.allowed:  # never for these pods; say so rather than print a made-up reply
            self.plain(f"pod/{name} created (the webhook allowed it)\n")
            return
        status = decision.review["response"]["status"]
        self.plain(
            f'The request is invalid: error when creating "{name}.yaml": admission webhook '
            f'"{WEBHOOK_NAME}" denied the request: {status["message"]}\n'
        )

    async def report(self, outcome: Outcome) -> None:
        """The pod's events as kubectl lists them (and the allocation record of a placed pod).

        gpushare's event comes first: the extender writes it while answering kube-scheduler,
        which records its own when the call returns. Listed with custom columns, so no age (a
        time the demo would have to make up) is printed.
        """
        await self.extender.events.drain()
        namespace, _, name = outcome.pod.partition("/")
        rows = [("TYPE", "REASON", "FROM", "MESSAGE")]
        for event in self.kube.events():
            involved = event.get("involvedObject") or {}
            if (involved.get("namespace"), involved.get("name")) == (namespace, name):
                source = str(event.get("reportingComponent") or "")
                rows.append((event["type"], event["reason"], source, event["message"]))
        reason = "Scheduled" if outcome.bound else "FailedScheduling"
        kind = "Normal" if outcome.bound else "Warning"
        rows.append((kind, reason, "ack-co-scheduler", outcome.event(self._total())))
        # kubectl's table writer: columns padded by 3 spaces, at least 6 wide
        widths = [max(6, *(len(row[i]) + 3 for row in rows)) for i in range(3)]
        self.shell(
            f"kubectl get events --field-selector involvedObject.name={name} "
            "-o custom-columns=TYPE:.type,REASON:.reason,FROM:.reportingComponent,"
            "MESSAGE:.message"
        )
        for row in rows:
            self.plain("".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:3])))
            self.plain(f"{row[3]}\n")
        if outcome.bound:
            pod = next(
                p
                for p in self.kube.pods()
                if (p["metadata"]["namespace"], p["metadata"]["name"]) == (namespace, name)
            )
            escaped = ANN_ALLOCATION.replace(".", "\\.")
            self.shell(f"kubectl get pod {name} -o jsonpath='{{.metadata.annotations.{escaped}}}'")
            self.plain(f"{pod['metadata'].get('annotations', {}).get(ANN_ALLOCATION)}\n")

    def _total(self) -> int:
        return len(self.kube.nodes())


def run_demo(console: Console | None = None) -> None:
    """Run the walkthrough and print it."""
    asyncio.run(Demo(console or Console()).run())
