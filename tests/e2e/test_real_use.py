"""GPU memory in use on the real node: a container allocating through the interposer's fake
driver shows its use in the device plugin's metrics, joined with per-GPU series by UUID, and
``kubectl inspect cgpu -d`` shows it beside the allocation.

The join is checked as a dashboard would write it, with Prometheus's own engine
(tests/support/promqlengine.py): the device plugin's scrape beside a per-GPU series labelled as
dcgm-exporter labels it (``gpu``, ``UUID``, ``modelName``), made here from the node's
inventory, since the fake GPUs have no DCGM.
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from harness.ports import free_port
from harness.realnode import RealNode, container, pod
from tests.support.promql import labelled, merge, scrape
from tests.support.promqlengine import evaluate, need_binary
from tests.support.realnode import NS, MiB, create

HOLD_MIB = 3000


@pytest.mark.usefixtures("ns")
def test_a_containers_use_shows_in_the_metrics_joined_by_uuid_and_in_inspect(
    real_node: RealNode, capsys: pytest.CaptureFixture[str]
) -> None:
    need_binary()
    cluster = real_node.cluster
    port = free_port()
    real_node.set_mode(
        "cgpu",
        unit="1GiB",
        extra=(
            "--metrics-port",
            str(port),
            "--no-metrics-authorization",  # who may read: test_metrics_access
            "--used-summary-interval",
            "1",
            "--log-format",
            "json",
        ),
    )
    script = (
        f"/memops alloc:{HOLD_MIB} hold > /tmp/held & "
        "until grep -q '^hold' /tmp/held; do sleep 0.1; done; echo READY; sleep 60"
    )
    create(cluster, [pod("user", NS, [container("main", 5, command=script)])])
    deadline = time.monotonic() + 120
    logs = ""
    while "READY" not in logs and time.monotonic() < deadline:
        time.sleep(0.5)
        logs = cluster.kubectl("logs", "-n", NS, "user", check=False).stdout
    assert "READY" in logs, logs
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    mine = [line for line in text.splitlines() if line.startswith("gpushare_container_")]
    target = {"namespace": "gpushare-system", "pod": "gpushare-device-plugin-x"}
    plugin = scrape(text, target)
    used = {
        k: v
        for k, v in plugin.items()
        if dict(k)["__name__"] == "gpushare_container_gpu_memory_used_bytes"
        and dict(k)["pod_name"] == "user"
    }
    [(labels, value)] = used.items()
    assert value == HOLD_MIB * MiB
    found = dict(labels)
    assert (found["pod_namespace"], found["container_name"]) == (NS, "main")
    node = cluster.kubectl_json("get", "node", real_node.name)
    inventory = json.loads(node["metadata"]["annotations"]["gpushare.io/gpus"])
    by_index = {str(g["index"]): g for g in inventory}
    assert found["UUID"] == by_index[found["gpu"]]["uuid"]

    # what dcgm-exporter would say of each GPU, labelled as it labels them
    dcgm_text = "# TYPE DCGM_FI_DEV_FB_TOTAL gauge\n" + "".join(
        f'DCGM_FI_DEV_FB_TOTAL{{gpu="{g["index"]}",UUID="{g["uuid"]}",modelName="{g["model"]}",'
        f'Hostname="{real_node.name}"}} {g["memUnits"] * 1024}\n'
        for g in inventory
    )
    dcgm = scrape(dcgm_text, {"namespace": "gpu-operator", "pod": "dcgm-exporter-x"})
    joined = evaluate(
        "sum by (UUID, modelName, pod_namespace, pod_name) ("
        "gpushare_container_gpu_memory_used_bytes / 2^20"
        " * on (UUID) group_left (modelName) (DCGM_FI_DEV_FB_TOTAL > bool 0))",
        merge(plugin, dcgm),
    )
    by = labelled(joined, "UUID", "pod_namespace", "pod_name")
    assert by[(found["UUID"], NS, "user")] == HOLD_MIB
    model = {dict(k)["modelName"] for k in joined}
    assert model == {by_index[found["gpu"]]["model"]}

    def summary() -> str:
        shown = cluster.kubectl("inspect", "cgpu", "-d").stdout
        return shown if "Used :" in shown and f" {HOLD_MIB / 1024:.1f}/5" in shown else ""

    deadline = time.monotonic() + 30
    shown = summary()
    while not shown and time.monotonic() < deadline:
        time.sleep(1)
        shown = summary()
    plugin_log = (cluster.root / "logs" / "gpushare-device-plugin.log").read_text()
    json_line = next(
        line
        for line in reversed(plugin_log.splitlines())
        if line.startswith('{"time"') and '"logger": "gpushare.' in line
    )
    with capsys.disabled():
        print("\n[real node] scraped:\n" + "\n".join(mine))
        print(f"[real node] joined with a dcgm-exporter series by UUID: {joined}")
        print(f"[real node] kubectl inspect cgpu -d:\n{shown}")
        print(f"[real node] a device plugin log line: {json_line}")
    assert shown, "kubectl inspect cgpu -d never showed the use"
    assert json.loads(json_line)["level"] in ("info", "warning")
