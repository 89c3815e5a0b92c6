"""The PodResources double answers as kubelet's List does (harness/podresources_double.py)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import grpc

from gpushare.deviceplugin.kubelet.protos.podresources_v1 import api_pb2 as pr
from gpushare.deviceplugin.kubelet.protos.podresources_v1 import api_pb2_grpc as pr_grpc
from gpushare.deviceplugin.kubelet.reconcile import ListedPod, list_pod_resources
from harness.podresources_double import PodResourcesDouble
from tests.support import grpc_loop

MEM = "aliyun.com/gpu-mem"


def manifest(name: str, *mems: int) -> dict[str, object]:
    return {
        "metadata": {"namespace": "ns", "name": name},
        "spec": {
            "containers": [
                {"name": f"c{i}", "resources": {"limits": {MEM: m}} if m else {}}
                for i, m in enumerate(mems)
            ]
        },
    }


def test_an_admitted_pod_lists_each_containers_devices_one_entry_per_id() -> None:
    async def main() -> tuple[list[ListedPod], pr.ListPodResourcesResponse, int]:
        with tempfile.TemporaryDirectory(dir="/tmp") as root:
            socket = Path(root) / "podres.sock"
            double = PodResourcesDouble(socket)
            await double.start()
            try:
                before = await list_pod_resources(socket)
                double.admit(manifest("a", 2, 0), MEM)
                double.admit(manifest("b", 1), MEM)
                double.forget("ns", "b")
                listed = await list_pod_resources(socket)
                async with grpc.aio.insecure_channel(f"unix://{socket}") as ch:
                    raw = await pr_grpc.PodResourcesListerStub(ch).List(
                        pr.ListPodResourcesRequest()
                    )
            finally:
                await double.stop()
            assert before == []
            return listed, raw, double.lists

    listed, raw, lists = grpc_loop.run(main())
    assert [(p.namespace, p.name) for p in listed] == [("ns", "a")]
    ids = listed[0].devices[("c0", MEM)]
    assert len(ids) == 2 and ("c1", MEM) not in listed[0].devices
    # every regular container listed, one ContainerDevices entry per device ID
    containers = raw.pod_resources[0].containers
    assert [c.name for c in containers] == ["c0", "c1"]
    assert sorted(list(d.device_ids) for d in containers[0].devices) == [[i] for i in sorted(ids)]
    assert list(containers[1].devices) == []
    assert lists == 3
