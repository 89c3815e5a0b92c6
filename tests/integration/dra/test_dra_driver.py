"""The DRA driver over its real gRPC sockets, with an in-memory API: registration, the slice,
prepare (idempotent, across a restart), unprepare, health, and the refusal of a non-DRA node."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpushare.core.model.units import MemoryUnit
from gpushare.dra.driver import DraDriver, DriverConfig
from gpushare.dra.kubeletapi import PLUGIN_TYPE, Sockets
from gpushare.dra.protos.dra_v1 import api_pb2 as dra
from gpushare.dra.protos.dra_v1 import api_pb2_grpc as dra_grpc
from gpushare.dra.protos.pluginregistration_v1 import api_pb2 as reg
from gpushare.dra.protos.pluginregistration_v1 import api_pb2_grpc as reg_grpc
from gpushare.kube.port import Conflict, KubeDict, NotFound
from gpushare.node.cdi import HandOff, Strategy
from gpushare.node.enforcement.hook import ContainerAnswer, NoIsolation, Target
from gpushare.node.gpus import FakeGpus
from gpushare.node.preflight import StartRefused


class MemoryDra:
    """The API calls the driver makes, in memory."""

    def __init__(self, labels: Mapping[str, str]) -> None:
        self.node = {"metadata": {"name": "n1", "labels": dict(labels)}}
        self.slices: dict[str, KubeDict] = {}
        self.claims: dict[tuple[str, str], KubeDict] = {}
        self.pods: dict[tuple[str, str], KubeDict] = {}
        self.version = 0

    async def get_node(self, name: str) -> KubeDict:
        return copy.deepcopy(self.node)

    async def list_node_slices(self, node: str, driver: str) -> list[KubeDict]:
        return [
            copy.deepcopy(s)
            for s in self.slices.values()
            if s["spec"]["nodeName"] == node and s["spec"]["driver"] == driver
        ]

    def _stored(self, obj: Mapping[str, Any]) -> KubeDict:
        self.version += 1
        stored = copy.deepcopy(dict(obj))
        stored["metadata"]["resourceVersion"] = str(self.version)
        self.slices[stored["metadata"]["name"]] = stored
        return copy.deepcopy(stored)

    async def create_resource_slice(self, obj: Mapping[str, Any]) -> KubeDict:
        if obj["metadata"]["name"] in self.slices:
            raise Conflict("exists")
        return self._stored(obj)

    async def replace_resource_slice(self, obj: Mapping[str, Any]) -> KubeDict:
        name = obj["metadata"]["name"]
        if name not in self.slices:
            raise NotFound(name)
        if self.slices[name]["metadata"]["resourceVersion"] != obj["metadata"]["resourceVersion"]:
            raise Conflict(name)
        return self._stored(obj)

    async def delete_resource_slice(self, name: str) -> None:
        if self.slices.pop(name, None) is None:
            raise NotFound(name)

    async def get_pod(self, namespace: str, name: str) -> KubeDict:
        try:
            return copy.deepcopy(self.pods[(namespace, name)])
        except KeyError:
            raise NotFound(f"{namespace}/{name}") from None

    async def get_resource_claim(self, namespace: str, name: str) -> KubeDict:
        try:
            return copy.deepcopy(self.claims[(namespace, name)])
        except KeyError:
            raise NotFound(f"{namespace}/{name}") from None


def claim(uid: str, memory: str, cores: str, device: str = "gpu-1") -> KubeDict:
    return {
        "metadata": {"name": f"c-{uid}", "namespace": "ns", "uid": uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": "gpushare.io",
                            "pool": "n1",
                            "device": device,
                            "consumedCapacity": {"memory": memory, "cores": cores},
                        }
                    ]
                }
            }
        },
    }


def driver(tmp: Path, api: MemoryDra, source: FakeGpus) -> DraDriver:
    config = DriverConfig(
        node="n1",
        unit=MemoryUnit.GiB,
        state_dir=tmp / "state",
        cdi_dir=tmp / "cdi",
        sockets=Sockets(registry_dir=tmp / "registry", plugin_dir=tmp / "plugins" / "gpushare.io"),
        handoff=HandOff(Strategy.ENVVAR),
    )
    return DraDriver(api=api, source=source, config=config, hook=NoIsolation())


async def prepare(sock: Path, *claims: KubeDict) -> Any:
    async with grpc.aio.insecure_channel(f"unix://{sock}") as channel:
        return await dra_grpc.DRAPluginStub(channel).NodePrepareResources(
            dra.NodePrepareResourcesRequest(
                claims=[
                    dra.Claim(namespace="ns", name=c["metadata"]["name"], uid=c["metadata"]["uid"])
                    for c in claims
                ]
            ),
            timeout=10,
        )


async def unprepare(sock: Path, c: KubeDict) -> Any:
    async with grpc.aio.insecure_channel(f"unix://{sock}") as channel:
        return await dra_grpc.DRAPluginStub(channel).NodeUnprepareResources(
            dra.NodeUnprepareResourcesRequest(
                claims=[
                    dra.Claim(namespace="ns", name=c["metadata"]["name"], uid=c["metadata"]["uid"])
                ]
            ),
            timeout=10,
        )


def test_registers_publishes_prepares_and_survives_a_restart(tmp_path: Path) -> None:
    api = MemoryDra({"gpushare.io/allocation-mode": "dra"})
    source = FakeGpus.parse("2x16GiB", node="n1")
    first, second = claim("u1", "3Gi", "30"), claim("u2", "5Gi", "0")
    api.claims = {("ns", "c-u1"): first, ("ns", "c-u2"): second}

    async def body() -> None:
        d = driver(tmp_path, api, source)
        await d.start()
        try:
            sockets = d.config.sockets
            async with grpc.aio.insecure_channel(f"unix://{sockets.registration}") as channel:
                stub = reg_grpc.RegistrationStub(channel)
                info = await stub.GetInfo(reg.InfoRequest(), timeout=5)
                assert (info.type, info.name) == (PLUGIN_TYPE, "gpushare.io")
                assert list(info.supported_versions) == ["v1.DRAPlugin"]
                assert info.endpoint == str(sockets.service)
                assert d.not_ready().startswith("kubelet has not registered")
                await stub.NotifyRegistrationStatus(
                    reg.RegistrationStatus(plugin_registered=True), timeout=5
                )
            assert d.not_ready() == ""
            [published] = api.slices.values()
            assert [x["name"] for x in published["spec"]["devices"]] == ["gpu-0", "gpu-1"]

            answer = await prepare(sockets.service, first, second)
            assert answer.claims["u1"].error == "" and answer.claims["u2"].error == ""
            [device] = answer.claims["u1"].devices
            assert (device.pool_name, device.device_name) == ("n1", "gpu-1")
            assert list(device.cdi_device_ids) == ["gpushare.io/claim=u1-gpu"]
            spec = json.loads((tmp_path / "cdi" / "gpushare.io-claim-u1.json").read_text())
            env = spec["devices"][0]["containerEdits"]["env"]
            assert "ALIYUN_COM_GPU_MEM_CONTAINER=3" in env
            assert "ALIYUN_COM_GPU_CORE_PERCENTAGE=30" in env
            assert "ALIYUN_COM_GPU_MEM_DEV=16" in env
            assert f"NVIDIA_VISIBLE_DEVICES={source.gpus()[1].uuid}" in env
            # kubelet retries: the same answer, without the API (the claim is gone there now)
            api.claims.clear()
            again = await prepare(sockets.service, first)
            assert list(again.claims["u1"].devices) == [device]
        finally:
            await d.stop()
        # a restarted driver still knows what it prepared, and unprepares it
        d = driver(tmp_path, api, source)
        await d.start()
        try:
            out = await unprepare(d.config.sockets.service, first)
            assert out.claims["u1"].error == ""
            assert not (tmp_path / "cdi" / "gpushare.io-claim-u1.json").exists()
            assert (tmp_path / "cdi" / "gpushare.io-claim-u2.json").exists()
            # unpreparing twice is fine
            out = await unprepare(d.config.sockets.service, first)
            assert out.claims["u1"].error == ""
        finally:
            await d.stop()

    asyncio.run(body())


def test_a_claim_made_again_or_missing_is_an_error_for_that_claim_only(tmp_path: Path) -> None:
    api = MemoryDra({"gpushare.io/allocation-mode": "dra"})
    good = claim("u1", "2Gi", "0", device="gpu-0")
    api.claims = {("ns", "c-u1"): good, ("ns", "c-u9"): claim("other", "2Gi", "0")}

    async def body() -> None:
        d = driver(tmp_path, api, FakeGpus.parse("1x16GiB", node="n1"))
        await d.start()
        try:
            stale = claim("u9", "2Gi", "0")
            answer = await prepare(d.config.sockets.service, good, stale, claim("u8", "1Gi", "0"))
            assert answer.claims["u1"].error == ""
            assert "UID other" in answer.claims["u9"].error
            assert "not found" in answer.claims["u8"].error
            assert answer.claims["u1"].devices[0].device_name == "gpu-0"
        finally:
            await d.stop()

    asyncio.run(body())


def test_an_unhealthy_gpu_leaves_the_slice(tmp_path: Path) -> None:
    api = MemoryDra({"gpushare.io/allocation-mode": "dra"})
    source = FakeGpus.parse("2x16GiB", node="n1")

    async def body() -> None:
        d = driver(tmp_path, api, source)
        await d.start()
        try:
            await asyncio.sleep(0.1)  # the health follower waits by now
            source.set_health(0, False)
            for _ in range(50):
                [published] = api.slices.values()
                if [x["name"] for x in published["spec"]["devices"]] == ["gpu-1"]:
                    break
                await asyncio.sleep(0.05)
            assert [x["name"] for x in published["spec"]["devices"]] == ["gpu-1"]
            assert published["spec"]["pool"]["generation"] == 2
        finally:
            await d.stop()

    asyncio.run(body())


def test_stale_slices_of_the_node_are_deleted(tmp_path: Path) -> None:
    api = MemoryDra({"gpushare.io/allocation-mode": "dra"})
    api.slices["old"] = {
        "metadata": {"name": "old", "resourceVersion": "1"},
        "spec": {"nodeName": "n1", "driver": "gpushare.io", "devices": []},
    }

    async def body() -> None:
        d = driver(tmp_path, api, FakeGpus.parse("1x16GiB", node="n1"))
        await d.start()
        await d.stop()

    asyncio.run(body())
    assert list(api.slices) == ["n1-gpushare-io"]


@pytest.mark.parametrize("labels", [{}, {"gpushare.io/allocation-mode": "device-plugin"}])
def test_a_node_not_labelled_for_dra_is_refused(tmp_path: Path, labels: dict[str, str]) -> None:
    api = MemoryDra(labels)

    async def body() -> None:
        await driver(tmp_path, api, FakeGpus.parse("1x16GiB", node="n1")).start()

    with pytest.raises(StartRefused, match=r"gpushare\.io/allocation-mode=dra"):
        asyncio.run(body())
    assert not api.slices


class Recording(NoIsolation):
    """A hook that remembers the targets it extended."""

    def __init__(self) -> None:
        self.targets: list[Target] = []

    def extend(self, answer: ContainerAnswer, target: Target) -> ContainerAnswer:
        self.targets.append(target)
        return answer


def test_a_cgpu_claim_takes_its_weight_from_the_pod_it_is_reserved_for(tmp_path: Path) -> None:
    api = MemoryDra({"gpushare.io/allocation-mode": "dra", "ack.node.gpu.schedule": "cgpu"})
    c = claim("u1", "2Gi", "0", device="gpu-0")
    c["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "pu"}]
    api.claims = {("ns", "c-u1"): c}
    api.pods = {
        ("ns", "p"): {
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "resourceClaims": [{"name": "g", "resourceClaimName": "c-u1"}],
                "containers": [
                    {
                        "name": "main",
                        "resources": {"claims": [{"name": "g"}]},
                        "env": [{"name": "ALIYUN_COM_GPU_SCHD_WEIGHT", "value": "3"}],
                    }
                ],
            },
        }
    }
    hook = Recording()

    async def body() -> None:
        d = driver(tmp_path, api, FakeGpus.parse("1x16GiB", node="n1"))
        d.hook = hook
        await d.start()
        try:
            answer = await prepare(d.config.sockets.service, c)
            assert answer.claims["u1"].error == ""
        finally:
            await d.stop()

    asyncio.run(body())
    [target] = hook.targets
    assert target.weight == 3
    assert [(p.uid, p.pod, p.container) for p in target.candidates] == [("u1", "ns/c-u1", "gpu")]
