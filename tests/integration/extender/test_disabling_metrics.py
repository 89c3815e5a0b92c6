"""A GPU out of service reads the same in the extender's metrics and its ``/inspect``."""

from __future__ import annotations

from gpushare.core.model.names import ANN_NODE_GPUS_DISABLED
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod
from tests.support.rig import Rig, run_with_rig
from tests.support.scraping import gpu, scrape


def test_out_of_service_gpu_in_metrics_inspect_and_placement() -> None:
    kube = MemoryKube()
    node = gpu_node("n1", gpus_units=[15, 15, 15])
    node["metadata"]["annotations"][ANN_NODE_GPUS_DISABLED] = "0,2"
    kube.put_node(node)
    pod = kube.create_pod(gpu_pod("p", mem=3))

    async def body(rig: Rig) -> None:
        outcome = await rig.driver.schedule(pod, ["n1"])
        assert outcome.bound
        await rig.settle()
        got = await scrape(rig)
        off = {k[1]: v for k, v in got.items() if k[0] == "gpushare_gpu_out_of_service"}
        assert off == {gpu("n1", 0): 1.0, gpu("n1", 1): 0.0, gpu("n1", 2): 1.0}
        assert got[("gpushare_gpu_unhealthy", gpu("n1", 0))] == 0.0
        doc = (await rig.client.get("/inspect")).json()
        gpus = doc["nodes"][0]["gpus"]
        assert [g["outOfService"] for g in gpus] == [True, False, True]
        assert [g["allocatedUnits"] for g in gpus] == [0, 3, 0]

    run_with_rig(kube, body)
