"""Metrics and pod Events of the extender and the device plugin, in-process."""

from __future__ import annotations

import asyncio
import platform
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import Counter, generate_latest
from prometheus_client.metrics_core import Metric

import gpushare
from gpushare.core.admitting.admission import AdmissionSettings
from gpushare.core.model.inventory import Mode
from gpushare.core.model.names import ANN_NODE_GPUS, ANN_NODE_HANDOFF, HANDOFF_PODRESOURCES
from gpushare.deviceplugin.config import PluginConfig
from gpushare.deviceplugin.metrics import registry_for, serve_metrics
from gpushare.deviceplugin.plugin import DevicePlugin
from gpushare.extender.events import SCHEDULED, UNSCHEDULABLE, EventRecorder
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod
from gpushare.kube.port import KubeError
from gpushare.node.gpus import FakeGpus
from gpushare.webhook.app import WebhookMetrics
from gpushare.webhook.app import create_app as create_webhook_app
from harness.ports import free_port
from tests.support.promql import target_label_clashes
from tests.support.rig import ConflictOnce, Rig, run_with_rig
from tests.support.scraping import Samples, cluster, gpu, samples, scrape

GIB = 2**30


def test_metrics_show_memory_core_pods_health_and_latency() -> None:
    kube = cluster()
    # the default profile: filter names every fitting node and prioritize is called
    first = kube.create_pod(gpu_pod("first", mem=3, scheduler="default-scheduler"))
    second = kube.create_pod(gpu_pod("second", mem=4))
    core = kube.create_pod(gpu_pod("infer", mem=4, core=30))
    nodes = ["node-a", "node-c", "node-sick"]

    async def body(rig: Rig) -> None:
        for pod in (first, second, core):
            assert (await rig.driver.schedule(pod, nodes)).bound
        await rig.settle()
        got = await scrape(rig)
        memory = {k[1]: v for k, v in got.items() if k[0] == "gpushare_gpu_memory_bytes"}
        assert memory[gpu("node-a", 0)] == 15 * GIB and memory[gpu("node-c", 0, "A10")] == 16 * GIB
        assert len(memory) == 5
        held = {k[1]: v for k, v in got.items() if k[0] == "gpushare_gpu_memory_allocated_bytes"}
        assert sum(held.values()) == 11 * GIB
        assert held[gpu("node-c", 0, "A10")] == 4 * GIB
        assert got[("gpushare_gpu_core_allocated_ratio", gpu("node-c", 0, "A10"))] == 0.3
        pods = {k[1]: v for k, v in got.items() if k[0] == "gpushare_gpu_pods"}
        assert sum(pods.values()) == 3
        assert got[("gpushare_gpu_unhealthy", gpu("node-sick", 1))] == 1.0
        assert got[("gpushare_gpu_unhealthy", gpu("node-sick", 0))] == 0.0
        # second is answered with its top node alone, infer fits on one node: no prioritize
        for verb, calls in (("filter", 3), ("prioritize", 1), ("bind", 3)):
            key = ("gpushare_extender_request_duration_seconds_count", (("verb", verb),))
            assert got[key] == calls
            bucket = (
                "gpushare_extender_request_duration_seconds_bucket",
                (("le", "+Inf"), ("verb", verb)),
            )
            assert got[bucket] == calls
        assert got[("gpushare_bind_total", (("outcome", "bound"),))] == 3
        assert got[("gpushare_events_total", (("reason", SCHEDULED),))] == 3
        assert got[("gpushare_cache_synced", ())] == 1.0

    run_with_rig(kube, body)


def test_bind_conflicts_are_counted() -> None:
    kube = ConflictOnce()
    kube.put_node(gpu_node("node-a", gpus_units=[15]))
    pod = kube.create_pod(gpu_pod("p", mem=3))

    async def body(rig: Rig) -> None:
        assert (await rig.driver.schedule(pod, ["node-a"])).bound
        got = await scrape(rig)
        assert got[("gpushare_bind_total", (("outcome", "conflict"),))] == 1
        assert ("gpushare_bind_conflicts_total", ()) not in got  # the same count, once
        assert got[("gpushare_handoff_deferrals_total", ())] == 0

    run_with_rig(kube, body)


def test_handoff_deferrals_are_counted() -> None:
    kube = MemoryKube()
    node = gpu_node("node-h", gpus_units=[15, 15])
    node["metadata"]["annotations"][ANN_NODE_HANDOFF] = HANDOFF_PODRESOURCES
    kube.put_node(node)
    waiting = kube.create_pod(gpu_pod("waiting", mem=10))
    later = kube.create_pod(gpu_pod("later", mem=10))

    async def body(rig: Rig) -> None:
        assert (await rig.driver.schedule(waiting, ["node-h"])).bound
        await rig.settle()
        outcome = await rig.driver.schedule(later, ["node-h"])
        assert not outcome.bound and "waiting for pod default/waiting" in outcome.failed["node-h"]
        got = await scrape(rig)
        assert got[("gpushare_handoff_deferrals_total", ())] == 1

    run_with_rig(kube, body)


def pod_events(kube: MemoryKube, name: str) -> list[dict[str, Any]]:
    return [e for e in kube.events() if e["involvedObject"]["name"] == name]


def test_events_explain_placement_and_refusal_once_per_message() -> None:
    kube = cluster()
    placed = kube.create_pod(gpu_pod("placed", mem=3))
    huge = kube.create_pod(gpu_pod("huge", mem=16))
    nodes = ["node-a", "node-c", "node-sick"]

    async def body(rig: Rig) -> None:
        rig.extender.events = EventRecorder(kube, instance="test", min_interval_s=0)
        assert (await rig.driver.schedule(placed, nodes)).bound
        for _ in range(3):  # kube-scheduler retries an unschedulable pod
            assert not (await rig.driver.schedule(huge, nodes)).bound
        await rig.extender.events.drain()
        [scheduled] = pod_events(kube, "placed")
        assert scheduled["reason"] == SCHEDULED and scheduled["type"] == "Normal"
        assert scheduled["message"] == "GPU0 on node-a, 3/15 GiB"
        assert scheduled["involvedObject"] == {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": "default",
            "name": "placed",
            "uid": placed["metadata"]["uid"],
        }
        assert scheduled["reportingComponent"] == "gpushare-extender"
        assert scheduled["source"] == {"component": "gpushare-extender"}
        [refused] = pod_events(kube, "huge")
        assert refused["reason"] == UNSCHEDULABLE and refused["type"] == "Warning"
        assert refused["count"] == 3
        assert refused["message"] == (
            "0/3 nodes kube-scheduler asked gpushare about fit: 2 × GPU0: 15 GiB total < "
            "16 GiB requested; GPU1: 15 GiB total < 16 GiB requested; 1 × node is core_mem and "
            "takes only pods that also ask for computing power (memory-only and memory+core "
            "pods never share a node)"
        )

    run_with_rig(kube, body)


def test_repeats_within_the_interval_write_nothing_new() -> None:
    kube = cluster()
    huge = kube.create_pod(gpu_pod("huge", mem=16))

    async def body(rig: Rig) -> None:
        rig.extender.events = EventRecorder(kube, instance="test", min_interval_s=60)
        for _ in range(5):
            await rig.driver.schedule(huge, ["node-a"])
        await rig.extender.events.drain()
        [refused] = pod_events(kube, "huge")
        assert refused["count"] == 1
        assert kube.calls.count("create_event") == 1 and "patch_event" not in kube.calls

    run_with_rig(kube, body)


def test_a_burst_of_binds_writes_normal_events_up_to_the_cap_and_every_warning() -> None:
    kube = MemoryKube()
    kube.put_node(gpu_node("node-a", gpus_units=[15] * 8))
    pods = [kube.create_pod(gpu_pod(f"p{i}", mem=1)) for i in range(6)]
    huge = kube.create_pod(gpu_pod("huge", mem=16))
    now = [1000.0]

    async def body(rig: Rig) -> None:
        recorder = rig.extender.events = EventRecorder(
            kube, instance="test", normal_per_s=1.0, normal_burst=2, clock=lambda: now[0]
        )
        for pod in pods[:4]:  # a burst: two within the burst, two past it
            assert (await rig.driver.schedule(pod, ["node-a"])).bound
        now[0] += 1.0  # a second later, one more token
        for pod in pods[4:]:
            assert (await rig.driver.schedule(pod, ["node-a"])).bound
        assert not (await rig.driver.schedule(huge, ["node-a"])).bound
        await recorder.drain()
        placed = [e["involvedObject"]["name"] for e in kube.events() if e["reason"] == SCHEDULED]
        assert placed == ["p0", "p1", "p4"]
        assert recorder.skipped == 3
        [refused] = pod_events(kube, "huge")
        assert refused["type"] == "Warning"  # never capped
        got = await scrape(rig)
        assert got[("gpushare_events_total", (("reason", SCHEDULED),))] == 3
        assert got[("gpushare_events_skipped_total", (("reason", SCHEDULED),))] == 3
        assert got[("gpushare_events_total", (("reason", UNSCHEDULABLE),))] == 1

    run_with_rig(kube, body)


def test_the_event_cap_refuses_a_negative_rate() -> None:
    with pytest.raises(ValueError, match=r"normal_per_s=-1.*must be 0 or more"):
        EventRecorder(MemoryKube(), normal_per_s=-1)


def test_a_cap_of_zero_writes_no_normal_event() -> None:
    recorder = EventRecorder(MemoryKube(), normal_per_s=0, normal_burst=50)
    assert not recorder.allows("Normal") and recorder.allows("Warning")


class NoEvents(MemoryKube):
    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        raise KubeError("events are forbidden")


def test_event_failures_never_break_scheduling() -> None:
    kube = NoEvents()
    kube.put_node(gpu_node("node-a", gpus_units=[15]))
    pod = kube.create_pod(gpu_pod("p", mem=3))
    huge = kube.create_pod(gpu_pod("huge", mem=16))

    async def body(rig: Rig) -> None:
        recorder = rig.extender.events = EventRecorder(kube, instance="test", min_interval_s=0)
        assert not (await rig.driver.schedule(huge, ["node-a"])).bound
        assert (await rig.driver.schedule(pod, ["node-a"])).bound
        await recorder.drain()
        assert recorder.failures == 2

    run_with_rig(kube, body)


def test_device_plugin_serves_metrics(tmp_path: Path) -> None:
    source = FakeGpus.parse("T4:15GiB,T4:15GiB", node="n1")
    plugin = DevicePlugin(
        api=MemoryKube(), source=source, config=PluginConfig(node="n1", state_dir=tmp_path)
    )
    plugin.stats.allocations = 3
    plugin.stats.refused = 1
    plugin.stats.mismatches = 2
    source.set_health(1, False)
    port = free_port()
    serve_metrics(registry_for(plugin, "n1"), port=port, host="127.0.0.1")

    def get() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            return str(reply.read().decode())

    got = samples(asyncio.run(asyncio.to_thread(get)))
    node = (("node", "n1"),)
    assert got[("gpushare_device_plugin_allocations_total", node)] == 3
    assert got[("gpushare_device_plugin_allocation_failures_total", node)] == 1
    assert got[("gpushare_device_plugin_podresources_mismatches_total", node)] == 2
    assert got[("gpushare_device_plugin_gpu_unhealthy", gpu("n1", 1, "T4"))] == 1
    assert got[("gpushare_device_plugin_gpu_memory_bytes", gpu("n1", 0, "T4"))] == 15 * GIB


def raw_series(text: str) -> list[str]:
    """Series names as exposed, straight from the text (no parser to hide anything)."""
    return [line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"]


def build_info(got: Samples) -> dict[str, str]:
    [labels] = [dict(k[1]) for k in got if k[0] == "gpushare_build_info"]
    assert got[("gpushare_build_info", tuple(sorted(labels.items())))] == 1
    return labels


def expect_build_info(got: Samples, component: str) -> None:
    assert build_info(got) == {
        "component": component,
        "version": gpushare.__version__,
        "python": platform.python_version(),
    }


def test_every_metrics_server_has_build_info_and_no_created_series(tmp_path: Path) -> None:
    # the extender, after calls of every verb, so its counters and histograms have children
    kube = cluster()
    pod = kube.create_pod(gpu_pod("p", mem=3))

    async def extender(rig: Rig) -> str:
        assert (await rig.driver.schedule(pod, ["node-a"])).bound
        return str((await rig.client.get("/metrics")).text)

    text = run_with_rig(kube, extender)
    assert "gpushare_bind_total" in raw_series(text)
    assert not [s for s in raw_series(text) if s.endswith("_created")]
    expect_build_info(samples(text), "extender")

    # the webhook, after a review
    async def webhook() -> str:
        transport = httpx.ASGITransport(app=create_webhook_app(AdmissionSettings()))
        async with httpx.AsyncClient(transport=transport, base_url="https://w") as client:
            await client.post("/validate", content=b"{not json")
            return str((await client.get("/metrics")).text)

    text = asyncio.run(webhook())
    assert "gpushare_webhook_reviews_total" in raw_series(text)
    assert not [s for s in raw_series(text) if s.endswith("_created")]
    expect_build_info(samples(text), "webhook")

    # the device plugin, over prometheus-client's own HTTP server, whole and restricted
    plugin = DevicePlugin(
        api=MemoryKube(),
        source=FakeGpus.parse("T4:15GiB", node="n1"),
        config=PluginConfig(node="n1", state_dir=tmp_path),
    )
    registry = registry_for(plugin, "n1")
    registry.register(ProbeCounter())  # a plain Counter, as a future metric might be
    port = free_port()
    serve_metrics(registry, port=port, host="127.0.0.1")
    for query in ("", "?name[]=gpushare_probe_total&name[]=gpushare_probe_created"):
        text = fetch(f"http://127.0.0.1:{port}/metrics{query}")
        assert "gpushare_probe_total" in raw_series(text)
        assert not [s for s in raw_series(text) if s.endswith("_created")], query
    only = fetch(f"http://127.0.0.1:{port}/metrics?name[]=gpushare_device_plugin_gpu_memory_bytes")
    assert set(raw_series(only)) == {"gpushare_device_plugin_gpu_memory_bytes"}
    expect_build_info(samples(fetch(f"http://127.0.0.1:{port}/metrics")), "device-plugin")


class ProbeCounter:
    """A collector holding one prometheus-client Counter (which would export ``_created``)."""

    def __init__(self) -> None:
        self.counter = Counter("gpushare_probe", "A counter", registry=None)
        self.counter.inc()

    def collect(self) -> Iterator[Metric]:
        yield from self.counter.collect()


def fetch(url: str) -> str:
    def get() -> str:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return str(reply.read().decode())

    return asyncio.run(asyncio.to_thread(get))


def test_behind_kube_scheduler_one_warning_per_pending_pod() -> None:
    """kube-scheduler's FailedScheduling carries the filter's reasons: gpushare adds its own
    Warning only where that message could not hold them whole."""
    kube = cluster()
    sizes = range(16, 40, 2)  # twelve node sizes: twelve distinct reasons for a 41 GiB pod
    for units in sizes:
        kube.put_node(gpu_node(f"node-{units}", gpus_units=[units, units]))
    huge = kube.create_pod(gpu_pod("huge", mem=16))
    giant = kube.create_pod(gpu_pod("giant", mem=41))
    everywhere = [f"node-{u}" for u in sizes]

    async def body(rig: Rig) -> None:
        rig.extender.events = EventRecorder(kube, instance="test", min_interval_s=0)
        rig.extender.scheduler_reports = True
        assert not (await rig.driver.schedule(huge, ["node-a", "node-c", "node-sick"])).bound
        assert not (await rig.driver.schedule(giant, everywhere)).bound
        await rig.extender.events.drain()
        assert pod_events(kube, "huge") == []  # kube-scheduler's event says all of it
        [refused] = pod_events(kube, "giant")
        assert refused["reason"] == UNSCHEDULABLE
        assert refused["message"].startswith("0/12 nodes kube-scheduler asked gpushare about fit")
        got = await scrape(rig)
        assert got[("gpushare_events_total", (("reason", UNSCHEDULABLE),))] == 1

    run_with_rig(kube, body)


def test_no_series_carries_a_label_that_prometheus_targets_carry() -> None:
    """A series label named like a target label (``namespace``, ``pod``, ...) is renamed
    ``exported_...`` at scrape time; the extender's and the webhook's series carry none."""
    kube = cluster()
    pod = kube.create_pod(gpu_pod("p", mem=3))

    async def body(rig: Rig) -> None:
        assert (await rig.driver.schedule(pod, ["node-a"])).bound
        text = (await rig.client.get("/metrics")).text
        assert "gpushare_namespace_gpu_memory_allocated_bytes{pod_namespace=" in text
        assert target_label_clashes(text) == set()

    run_with_rig(kube, body)
    webhook = generate_latest(WebhookMetrics().registry).decode()
    assert target_label_clashes(webhook) == set()


def test_gpu_labels_are_escaped_as_the_text_format_asks() -> None:
    kube = MemoryKube()
    odd = 'A "B" \\ C\nD'
    kube.put_node(gpu_node("n1", gpus_units=[15, 15], model=odd))

    async def body(rig: Rig) -> None:
        got = await scrape(rig)
        assert got[("gpushare_gpu_memory_bytes", gpu("n1", 1, odd))] == 15 * GIB
        assert got[("gpushare_gpu_out_of_service", gpu("n1", 0, odd))] == 0.0

    run_with_rig(kube, body)


def test_labelled_nodes_without_a_serving_device_plugin_are_exported_by_name() -> None:
    """What GPUShareDevicePluginMissing reads: a series for each labelled node no plugin serves,
    none for the served, the unlabelled, or the one whose GPUs are all withdrawn."""
    kube = MemoryKube()
    kube.put_node(gpu_node("served"))
    never = gpu_node("never", mode=Mode.CGPU)
    del never["metadata"]["annotations"][ANN_NODE_GPUS]
    for part in ("capacity", "allocatable"):
        never["status"][part].pop("aliyun.com/gpu-mem")
    kube.put_node(never)
    gone = gpu_node("gone")
    gone["status"]["allocatable"]["aliyun.com/gpu-mem"] = "0"
    kube.put_node(gone)
    kube.put_node(gpu_node("sick", unhealthy=[0]))
    kube.put_node(gpu_node("plain", mode=None))

    async def body(rig: Rig) -> None:
        got = await scrape(rig)
        missing = {k[1]: v for k, v in got.items() if k[0] == "gpushare_node_device_plugin_missing"}
        assert missing == {
            (("mode", "cgpu"), ("node", "never"), ("reason", "unpublished")): 1.0,
            (("mode", "share"), ("node", "gone"), ("reason", "unregistered")): 1.0,
        }

    run_with_rig(kube, body)


def test_a_scrape_lets_kube_schedulers_calls_in_between() -> None:
    """At 1,000 nodes a scrape writes 48,000 per-GPU lines: the event loop that answers
    kube-scheduler gets several turns (one each ``NODES_PER_TURN`` nodes), not one at the end."""
    kube = MemoryKube()
    nodes = 1000
    for i in range(nodes):
        kube.put_node(gpu_node(f"n{i:04d}", gpus_units=[15] * 8, mode=Mode.CGPU))

    async def body(rig: Rig) -> None:
        turns = 0
        done = False

        async def ticker() -> None:
            nonlocal turns
            while not done:
                turns += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        start = turns
        got = await scrape(rig)
        during = turns - start
        done = True
        await task
        memory = [k for k in got if k[0] == "gpushare_gpu_memory_bytes"]
        assert len(memory) == nodes * 8
        assert during >= nodes // 250 - 1, f"{during} turns during the scrape"

    run_with_rig(kube, body)
