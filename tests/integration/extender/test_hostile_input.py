"""Hostile objects and bodies: no value from the API or a request raises past the boundary.

Findings 4, 5 and 7 of the hostile-tenant review, each reproduced first, and then fuzzed over
every field and annotation gpushare reads (``harness/hostile.py``):

- one annotation (``ALIYUN_COM_GPU_MEM_ASSUME_TIME: "²"``) ended the extender's watch, which
  then stayed ready while blind; node annotations with numbers past Python's 4,300-digit limit
  did the same;
- wrong JSON types in ``spec.affinity``, ``spec.overhead`` and pod-level ``spec.resources`` got
  500s; bind's ``PodName`` went into the API path unescaped; bodies of any size were parsed;
- ``1000``, which kube-apiserver stores as ``"1k"``, was refused.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.core.model.names import (
    ANN_ASSUME_TIME,
    ANN_NODE_GPUS,
    ANN_NODE_GPUS_DISABLED,
    ANN_NODE_TOPOLOGY,
    LABEL_POD_GPU_COUNT,
)
from gpushare.core.model.requests import PodRequest, read_pod
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.allocation import plan
from gpushare.core.records.trust import SealKey, Trust
from gpushare.extender.app import create_app
from gpushare.extender.service import UNSEEN_TTL_S, Extender
from gpushare.kube.cache import ClusterCache
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod, placed
from gpushare.kube.port import KubeDict, WatchEvent
from harness.hostile import NODE_PATHS, POD_PATHS, mutated, mutations
from tests.support.rig import Rig, run_with_rig

NODE = "gpu-node"
HUGE = "1" * 4301


def cluster() -> MemoryKube:
    kube = MemoryKube()
    kube.put_node(gpu_node(NODE, gpus_units=[15, 15]))
    return kube


def sealed(kube: MemoryKube, name: str, mem: int, **annotations: str) -> KubeDict:
    """A pod bound by gpushare to GPU 0, its record sealed, with extra annotations."""
    obj = gpu_pod(name, mem=mem)
    obj["metadata"]["uid"] = f"uid-{name}"
    request = read_pod(obj)
    assert isinstance(request, PodRequest)
    allocation = plan(request, node=NODE, indexes=[0], unit=MemoryUnit.GiB)
    pod = placed(obj, allocation, trust=Trust.sealed(SealKey(kube.seal_key)))
    pod["metadata"]["annotations"].update(annotations)
    return pod


async def until(check: Any, rig: Rig) -> None:
    for _ in range(100):
        await rig.settle()
        if check():
            return
    raise AssertionError("the cache never caught up")


@pytest.mark.parametrize(
    ("kind", "annotations"),
    [
        ("pod", {ANN_ASSUME_TIME: "²"}),
        ("pod", {ANN_ASSUME_TIME: HUGE}),
        ("node", {ANN_NODE_GPUS: HUGE}),
        ("node", {ANN_NODE_GPUS: "[" * 5000}),
        ("node", {ANN_NODE_GPUS_DISABLED: HUGE}),
        ("node", {ANN_NODE_GPUS_DISABLED: "²"}),
        ("node", {ANN_NODE_TOPOLOGY: '{"version": 1, "distance": ' + HUGE + "}"}),
    ],
)
def test_finding_4_one_annotation_no_longer_ends_the_watch(
    kind: str, annotations: dict[str, str]
) -> None:
    """The hostile object is taken in or skipped; events after it still arrive."""

    async def body(rig: Rig) -> None:
        if kind == "pod":
            rig.kube.create_pod(sealed(rig.kube, "hostile", 3, **annotations))
        else:
            node = gpu_node("hostile-node", gpus_units=[15])
            node["metadata"]["annotations"].update(annotations)
            rig.kube.put_node(node)
        rig.kube.put_node(gpu_node("later-node", gpus_units=[15]))
        rig.kube.create_pod(sealed(rig.kube, "later", 4))
        await until(lambda: rig.cache.state.ledger.usage(NODE).mem_units >= 4, rig)
        assert "later-node" in rig.cache.state.nodes
        assert (await rig.client.get("/readyz")).status_code == 200

    run_with_rig(cluster(), body)


def test_finding_4_a_sealed_pod_with_a_bad_assume_time_still_holds_its_gpu() -> None:
    async def body(rig: Rig) -> None:
        rig.kube.create_pod(sealed(rig.kube, "odd", 5, **{ANN_ASSUME_TIME: "²"}))
        await until(lambda: rig.cache.state.ledger.usage(NODE).mem_units == 5, rig)

    run_with_rig(cluster(), body)


def test_readiness_tells_the_truth_when_the_watch_ends() -> None:
    """A cache task that ended (any reason) leaves the extender not ready, with the reason."""

    async def main() -> None:
        kube = cluster()
        settings_ = Settings()
        scheduler = Scheduler(settings_)
        cache = ClusterCache(kube, settings=settings_, workload=scheduler.workload)

        async def broken(take: object) -> None:
            await cache.sync()
            raise RuntimeError("watch decoder broke")

        cache.run = broken  # type: ignore[method-assign]
        extender = Extender(api=kube, cache=cache, scheduler=scheduler)
        app = create_app(extender, run_cache=True)
        async with app.router.lifespan_context(app):
            client = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://extender"
            )
            for _ in range(50):
                await asyncio.sleep(0)
            reply = await client.get("/readyz")
            assert reply.status_code == 503
            assert "watch decoder broke" in reply.json()["reason"]
            await client.aclose()

    asyncio.run(main())


def test_a_list_that_fails_in_a_reader_is_retried_and_reported_not_ready() -> None:
    async def body(rig: Rig) -> None:
        real = rig.cache.state._read
        calls = 0

        def failing(node: KubeDict) -> Any:
            nonlocal calls
            calls += 1
            raise ValueError("reader bug")

        rig.cache.state._read = failing  # type: ignore[method-assign]
        with pytest.raises(ValueError):
            await rig.cache.sync(rig.extender.take)
        rig.cache.state._read = real  # type: ignore[method-assign]
        assert calls == 1
        await rig.cache.sync(rig.extender.take)
        assert rig.cache.problem == ""

    run_with_rig(cluster(), body)


def test_a_watched_object_of_the_wrong_shape_is_skipped_and_counted() -> None:
    async def body(rig: Rig) -> None:
        bad = gpu_pod("bad", mem=1)
        bad["spec"]["affinity"] = {"nodeAffinity": []}
        rig.extender.take(rig.cache.apply_pod(WatchEvent("ADDED", bad)))
        good = gpu_node("fine", gpus_units=[15])
        rig.extender.take(rig.cache.apply_node(WatchEvent("ADDED", good)))
        assert "fine" in rig.cache.state.nodes
        text = generate_latest(rig.extender.metrics.registry).decode()
        assert 'gpushare_watch_skipped_total{kind="Pod",reason="shape"} 1.0' in text

    run_with_rig(cluster(), body)


def pod_body(**spec: Any) -> dict[str, Any]:
    pod = gpu_pod("p", mem=1)
    pod["spec"].update(spec)
    return {"Pod": pod, "NodeNames": [NODE]}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (pod_body(affinity={"nodeAffinity": []}), "Pod.spec.affinity.nodeAffinity"),
        (
            pod_body(
                affinity={
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [{"matchExpressions": [{"values": "x"}]}]
                        }
                    }
                }
            ),
            "matchExpressions[0].values",
        ),
        (pod_body(overhead=[1]), "Pod.spec.overhead"),
        (pod_body(overhead={"cpu": True}), "Pod.spec.overhead.cpu"),
        (pod_body(resources={"requests": 3}), "Pod.spec.resources.requests"),
        (pod_body(resources=[]), "Pod.spec.resources"),
        (pod_body(topologySpreadConstraints=[3]), "Pod.spec.topologySpreadConstraints[0]"),
        (pod_body(resourceClaims={}), "Pod.spec.resourceClaims"),
    ],
)
def test_finding_5_wrong_types_are_a_400_naming_the_field(body: Any, field: str) -> None:
    async def run(rig: Rig) -> None:
        for verb in ("filter", "prioritize"):
            reply = await rig.client.post(f"/{verb}", json=body)
            assert reply.status_code == 400, reply.text
            assert field in reply.json()["detail"][0]["msg"]

    run_with_rig(cluster(), run)


def test_finding_5_huge_numbers_in_labels_are_a_reason_not_a_500() -> None:
    async def run(rig: Rig) -> None:
        pod = gpu_pod("p", mem=1)
        pod["metadata"]["labels"][LABEL_POD_GPU_COUNT] = HUGE
        reply = await rig.client.post("/filter", json={"Pod": pod, "NodeNames": [NODE]})
        assert reply.status_code == 200
        assert LABEL_POD_GPU_COUNT in reply.json()["FailedAndUnresolvableNodes"][NODE]

    run_with_rig(cluster(), run)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("PodName", f"../../../nodes/{NODE}"),
        ("PodName", "x?dryRun=All"),
        ("PodName", "x/status"),
        ("PodNamespace", "default/pods/x"),
        ("PodNamespace", "a.b"),
        ("Node", "../x"),
        ("PodName", ""),
    ],
)
def test_finding_5_names_that_would_leave_the_api_path_are_refused(field: str, value: str) -> None:
    async def run(rig: Rig) -> None:
        body = {"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": NODE}
        body[field] = value
        reply = await rig.client.post("/bind", json=body)
        assert reply.status_code == 400
        assert reply.json()["detail"][0]["msg"].startswith(f"{field}: ")
        assert "DNS-1123" in reply.json()["detail"][0]["msg"]

    run_with_rig(cluster(), run)


def test_finding_5_a_body_over_the_limit_is_refused_unread() -> None:
    async def run(rig: Rig) -> None:
        filler = "x" * (9 * 1024 * 1024)
        body = json.dumps({"Pod": {"metadata": {"name": filler}}, "NodeNames": []}).encode()
        for verb in ("filter", "prioritize", "bind"):
            reply = await rig.client.post(f"/{verb}", content=body)
            assert reply.status_code == 413, verb
            assert "more than 8388608 bytes" in reply.json()["detail"][0]["msg"]

    run_with_rig(cluster(), run)


def test_finding_7_a_thousand_units_stored_as_1k_are_placed_and_held() -> None:
    """At 128 MiB units 1000 is 125 GiB; kube-apiserver writes it back as ``"1k"``."""
    unit = MemoryUnit.MiB128
    kube = MemoryKube()
    kube.put_node(gpu_node(NODE, gpus_units=[1280, 1280], unit=unit))
    pod = gpu_pod("big", mem="1k")
    kube.create_pod(pod)

    async def run(rig: Rig) -> None:
        stored = await rig.kube.get_pod("default", "big")
        filtered = await rig.post("filter", {"Pod": stored, "NodeNames": [NODE]})
        assert filtered["NodeNames"] == [NODE], filtered
        reply = await rig.post(
            "bind",
            {
                "PodName": "big",
                "PodNamespace": "default",
                "PodUID": stored["metadata"]["uid"],
                "Node": NODE,
            },
        )
        assert reply == {"Error": ""}
        await until(lambda: rig.cache.state.ledger.usage(NODE).mem_units == 1000, rig)
        await rig.cache.sync(rig.extender.take)  # rebuilt from the annotations alone: still held
        assert rig.cache.state.ledger.usage(NODE).mem_units == 1000

    run_with_rig(kube, run, Settings(unit=unit))


# -- fuzzing: every field gpushare reads, set to anything --------------------------------------


def _fresh() -> tuple[MemoryKube, ClusterCache, httpx.AsyncClient]:
    kube = cluster()
    settings_ = Settings()
    scheduler = Scheduler(settings_)
    cache = ClusterCache(kube, settings=settings_, workload=scheduler.workload)
    extender = Extender(api=kube, cache=cache, scheduler=scheduler)
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(extender)), base_url="http://extender"
    )
    return kube, cache, client


def _json_safe(obj: Any) -> bool:
    try:
        json.dumps(obj, allow_nan=False)
    except (ValueError, TypeError):
        return False
    return True


async def _through_everything(kind: str, obj: KubeDict) -> None:
    """The object through the cache (list and watch) and the routes: nothing may raise or 500."""
    kube, cache, client = _fresh()
    try:
        await cache.sync()
        pod = sealed(kube, "victim", 3)
        if kind == "pod":
            cache.apply_pod(WatchEvent("ADDED", obj))
            cache.apply_pod(WatchEvent("MODIFIED", obj))
        else:
            cache.apply_node(WatchEvent("ADDED", obj))
        cache.apply_pod(WatchEvent("ADDED", pod))
        assert cache.state.ledger.usage(NODE).mem_units >= 3  # later events still taken in
        if _json_safe(obj):
            body = (
                {"Pod": obj, "NodeNames": [NODE]}
                if kind == "pod"
                else {"Pod": gpu_pod("p", mem=1), "Nodes": {"items": [obj]}}
            )
            for verb in ("filter", "prioritize"):
                reply = await client.post(f"/{verb}", json=body)
                assert reply.status_code < 500, (verb, reply.text)
        if kind == "pod":
            kube.create_pod(pod)
            listed = [obj] if kind == "pod" else []
            kube.list_pods = _listing(kube, listed)  # type: ignore[method-assign]
        else:
            kube.put_node(gpu_node("n2"))
            kube.list_nodes = _listing(kube, [obj], nodes=True)  # type: ignore[method-assign]
        await cache.sync()  # the list takes it in or skips it too
        assert cache.synced and NODE in cache.state.nodes
    finally:
        await client.aclose()


def _listing(kube: MemoryKube, extra: list[KubeDict], *, nodes: bool = False) -> Any:
    real = kube.list_nodes if nodes else kube.list_pods

    async def listing(*args: Any) -> tuple[list[KubeDict], str]:
        items, version = await real(*args)
        return [*items, *extra], version

    return listing


_fuzzing = settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@_fuzzing
@given(mutations(POD_PATHS))
def test_fuzz_no_pod_field_raises_past_the_boundary(changes: Any) -> None:
    logging.disable(logging.CRITICAL)
    try:
        asyncio.run(_through_everything("pod", mutated(gpu_pod("hostile", mem=3), changes)))
    finally:
        logging.disable(logging.NOTSET)


@_fuzzing
@given(mutations(NODE_PATHS))
def test_fuzz_no_node_field_raises_past_the_boundary(changes: Any) -> None:
    logging.disable(logging.CRITICAL)
    try:
        node = mutated(gpu_node("hostile-node", gpus_units=[15]), changes)
        asyncio.run(_through_everything("node", node))
    finally:
        logging.disable(logging.NOTSET)


@_fuzzing
@given(
    st.fixed_dictionaries(
        {
            "PodName": st.one_of(st.text(max_size=20), st.integers(), st.none()),
            "PodNamespace": st.one_of(st.text(max_size=20), st.sampled_from(["default"])),
            "PodUID": st.text(max_size=5),
            "Node": st.one_of(st.text(max_size=20), st.sampled_from([NODE])),
        }
    )
)
def test_fuzz_bind_bodies_are_answered_never_a_500(body: dict[str, Any]) -> None:
    async def run() -> None:
        _, cache, client = _fresh()
        await cache.sync()
        try:
            reply = await client.post("/bind", json=body)
            assert reply.status_code in (200, 400), reply.text
        finally:
            await client.aclose()

    asyncio.run(run())


def test_finding_5_a_filter_for_a_pod_that_does_not_exist_holds_nothing_for_long() -> None:
    """Anything that reaches the port can send a filter: an intent for a pod the watch has not
    shown lasts ``UNSEEN_TTL_S``, and the full ``INTENT_TTL_S`` once the watch shows it."""

    async def run(rig: Rig) -> None:
        now = [1_700_000_000 * 10**9]
        rig.extender.clock_ns = lambda: now[0]
        for n in range(2):
            ghost = gpu_pod(f"ghost-{n}", mem=15)
            ghost["metadata"]["uid"] = f"ghost-uid-{n}"
            reply = await rig.post("filter", {"Pod": ghost, "NodeNames": [NODE]})
            assert reply["NodeNames"] == [NODE]
        assert rig.cache.state.ledger.usage(NODE).mem_units == 30  # booked, for a moment
        real = rig.kube.create_pod(gpu_pod("real", mem=15))
        now[0] += int((UNSEEN_TTL_S + 0.5) * 1e9)
        rig.extender.sweep()
        assert rig.cache.state.ledger.usage(NODE).mem_units == 0  # the ghosts' intents are gone
        await rig.post("filter", {"Pod": real, "NodeNames": [NODE]})  # before the watch has it
        await rig.settle()  # now the watch shows it
        now[0] += int(1e9)
        rig.extender.sweep()
        now[0] += int((UNSEEN_TTL_S + 1) * 1e9)
        rig.extender.sweep()
        assert rig.cache.state.ledger.usage(NODE).mem_units == 15  # seen: its intent kept
        text = generate_latest(rig.extender.metrics.registry).decode()
        assert 'gpushare_intents_total{outcome="unseen"} 3.0' in text

    run_with_rig(cluster(), run)


@pytest.mark.parametrize("field", ["requests", "limits"])
@pytest.mark.parametrize(
    "cpu", [1.7976931348623157e308, 10**400, "9" * 60 + "e60"], ids=["float", "int", "text"]
)
def test_a_cpu_beyond_what_kubernetes_counts_is_no_crash(field: str, cpu: Any) -> None:
    """Found by the fuzz test above: a float near the largest one, times a thousand for milli-CPU
    and weighed by the workload the policy learned, overflowed in the gpushare policy's balance
    of CPU per GPU and ended the filter with a 500 (``OverflowError``)."""
    pod = gpu_pod("hostile", mem=3)
    pod["spec"]["containers"][0]["resources"][field] = {
        **pod["spec"]["containers"][0]["resources"].get(field, {}),
        "cpu": cpu,
    }
    logging.disable(logging.CRITICAL)
    try:
        asyncio.run(_through_everything("pod", pod))
    finally:
        logging.disable(logging.NOTSET)
