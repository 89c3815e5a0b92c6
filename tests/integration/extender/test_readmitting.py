"""GPU pods kubelet refused while the device plugin was away: a bare one comes back under its
name, a controller's is left to the controller, anything else is left alone."""

from __future__ import annotations

import asyncio
from typing import Any

from gpushare.core.decision.clusterstate import PodTaken
from gpushare.core.decision.scheduling import Settings
from gpushare.core.model.names import ANN_ALLOCATION, ANN_REFUSAL_REPORTED, DEFAULT_NAMES
from gpushare.core.records.readmission import MAX_RECREATIONS, Step, readmission, replacement
from gpushare.extender.events import EventRecorder
from gpushare.extender.readmitting import RECREATED, REFUSED, Readmitter
from gpushare.kube.cache import Change, ClusterCache, Take
from gpushare.kube.memory import MemoryKube
from gpushare.kube.port import KubeDict

MESSAGE = (
    "Pod was rejected: Allocate failed due to no healthy devices present; cannot allocate "
    "unhealthy devices aliyun.com/gpu-mem, which is unexpected"
)


def refused(name: str = "p", **metadata: Any) -> KubeDict:
    """A pod gpushare placed on node n1 that kubelet then refused, as kubelet leaves it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "team",
            "labels": {"app": "x"},
            "annotations": {ANN_ALLOCATION: "{}", "ALIYUN_COM_GPU_MEM_IDX": "0", "keep": "me"},
            **metadata,
        },
        "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "busybox"}]},
        "status": {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": MESSAGE},
    }


def test_only_a_refusal_for_want_of_the_plugin_counts() -> None:
    assert readmission(refused(), DEFAULT_NAMES).step is Step.RECREATE
    other = refused()
    other["status"]["message"] = MESSAGE.replace("aliyun.com/gpu-mem", "nvidia.com/gpu")
    assert readmission(other, DEFAULT_NAMES).step is Step.NOTHING
    unplaced = refused()
    del unplaced["metadata"]["annotations"][ANN_ALLOCATION]
    assert readmission(unplaced, DEFAULT_NAMES).step is Step.NOTHING
    crashed = refused()
    crashed["status"] = {"phase": "Failed", "reason": "Error"}
    assert readmission(crashed, DEFAULT_NAMES).step is Step.NOTHING
    out_of = refused()
    out_of["status"] = {"phase": "Failed", "reason": "OutOfaliyun.com/gpu-mem", "message": "x"}
    assert readmission(out_of, DEFAULT_NAMES).step is Step.RECREATE
    cut_off = refused()
    cut_off["status"]["message"] = (
        "Pod was rejected: Allocate failed due to rpc error: code = Unavailable desc = error "
        "reading from server: EOF, which is unexpected"
    )
    assert readmission(cut_off, DEFAULT_NAMES).step is Step.RECREATE
    cut_off["status"]["message"] = (
        "Pod was rejected: Allocate failed due to device plugin GetPreferredAllocation rpc "
        "failed with err: rpc error: code = Unavailable desc = error reading from server: EOF"
    )
    assert readmission(cut_off, DEFAULT_NAMES).step is Step.RECREATE
    cut_off["status"]["message"] = (  # the soak's, when kubelet closed its client meanwhile
        "Pod was rejected: Allocate failed due to device plugin GetPreferredAllocation rpc "
        "failed with err: rpc error: code = Canceled desc = grpc: the client connection is "
        "closing, which is unexpected"
    )
    assert readmission(cut_off, DEFAULT_NAMES).step is Step.RECREATE
    stopped = refused()  # CI's, when kubelet had stopped the plugin's endpoint meanwhile
    stopped["status"]["message"] = (
        "Pod was rejected: Allocate failed due to device plugin GetPreferredAllocation rpc "
        "failed with err: endpoint &{{{} {0 0}} aliyun.com/gpu-mem 0x28ead2b38290 "
        "{14031633267636162576 10686874868 0x5492f60} <nil>} has been stopped, which is "
        "unexpected"
    )
    assert readmission(stopped, DEFAULT_NAMES).step is Step.RECREATE
    stopped["status"]["message"] = stopped["status"]["message"].replace(
        "aliyun.com/gpu-mem", "nvidia.com/gpu"
    )
    assert readmission(stopped, DEFAULT_NAMES).step is Step.NOTHING


def test_a_controllers_pod_a_finalized_pod_and_a_looping_name_are_not_recreated() -> None:
    owned = refused(ownerReferences=[{"kind": "ReplicaSet", "name": "rs", "controller": True}])
    decided = readmission(owned, DEFAULT_NAMES)
    assert decided.step is Step.CONTROLLER and "ReplicaSet/rs replaces it" in decided.why
    assert readmission(refused(finalizers=["x/y"]), DEFAULT_NAMES).step is Step.NOTHING
    looping = readmission(refused(), DEFAULT_NAMES, recreated=MAX_RECREATIONS)
    assert looping.step is Step.NOTHING and "leaves it Failed" in looping.why


def test_the_replacement_keeps_the_authors_pod_and_drops_the_hand_off() -> None:
    fresh = replacement(refused(uid="u1", resourceVersion="7"))
    assert fresh["metadata"] == {
        "name": "p",
        "namespace": "team",
        "labels": {"app": "x"},
        "annotations": {"keep": "me"},
    }
    assert "nodeName" not in fresh["spec"] and fresh["spec"]["containers"][0]["name"] == "main"


def failed_to(readmitter: Readmitter) -> Take:
    """Hand the Failed pods the cache takes in to the readmitter, as the extender does."""

    def take(change: Change) -> None:
        if isinstance(change, PodTaken) and change.failed:
            readmitter.seen(change.pod)

    return take


def test_the_extender_recreates_a_refused_bare_pod_once_with_events() -> None:
    async def scenario() -> None:
        kube = MemoryKube()
        cache = ClusterCache(kube, settings=Settings())
        events = EventRecorder(kube, min_interval_s=0)
        readmitter = Readmitter(kube, names=DEFAULT_NAMES, events=events)
        old = kube.create_pod(refused())
        owned = kube.create_pod(
            refused("q", ownerReferences=[{"kind": "Job", "name": "j", "controller": True}])
        )
        await cache.sync(failed_to(readmitter))
        for _ in range(50):
            await asyncio.sleep(0.01)
            if readmitter.counts["recreated"]:
                break
        await cache.sync(failed_to(readmitter))  # the same refusal seen again is not acted on twice
        await asyncio.sleep(0.05)
        pods = {p["metadata"]["name"]: p for p in kube.pods()}
        new = pods["p"]
        assert new["metadata"]["uid"] != old["metadata"]["uid"]
        assert new["status"]["phase"] == "Pending" and "nodeName" not in new["spec"]
        assert pods["q"]["metadata"]["uid"] == owned["metadata"]["uid"]
        assert readmitter.counts == {"controller": 1, "recreated": 1, "left": 0, "error": 0}
        reasons = sorted((e["involvedObject"]["name"], e["reason"]) for e in kube.events())
        assert reasons == [("p", RECREATED), ("p", REFUSED), ("q", REFUSED)]

    asyncio.run(scenario())


def test_with_re_creation_off_the_event_says_the_pod_stays_failed() -> None:
    """The chart's default (recreateRefusedPods: false) must not promise a re-creation."""
    left = readmission(refused(), DEFAULT_NAMES, recreate=False)
    assert left.step is Step.NOTHING
    assert "it stays Failed" in left.why and "re-creates it" not in left.why
    assert "re-creates it under the same name" in readmission(refused(), DEFAULT_NAMES).why


def test_a_restarted_extender_does_not_report_a_pod_it_reported_already() -> None:
    """The first extender writes the event and marks the pod; a second one, started later
    with nothing in memory, lists the same Failed pod and writes nothing."""

    async def extender_run(kube: MemoryKube) -> Readmitter:
        cache = ClusterCache(kube, settings=Settings())
        events = EventRecorder(kube, min_interval_s=0)
        readmitter = Readmitter(kube, names=DEFAULT_NAMES, events=events, recreate=False)
        await cache.sync(failed_to(readmitter))
        for _ in range(20):
            await asyncio.sleep(0.01)
        return readmitter

    async def scenario() -> None:
        kube = MemoryKube()
        kube.create_pod(refused())
        first = await extender_run(kube)
        assert first.counts["left"] == 1
        (pod,) = kube.pods()
        assert ANN_REFUSAL_REPORTED in pod["metadata"]["annotations"]
        assert pod["status"]["phase"] == "Failed"
        second = await extender_run(kube)  # a restart: a new process, the same cluster
        assert second.counts == {"controller": 0, "recreated": 0, "left": 0, "error": 0}
        reasons = [(e["involvedObject"]["name"], e["reason"]) for e in kube.events()]
        assert reasons == [("p", REFUSED)]
        (event,) = kube.events()
        assert "it stays Failed" in event["message"]

    asyncio.run(scenario())
