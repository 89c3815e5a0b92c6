"""``kubectl inspect cgpu`` rendering: golden text and JSON."""

from __future__ import annotations

import json
from collections.abc import Callable

from gpushare.core.booking.ledger import Ledger
from gpushare.core.model.inventory import read_node
from gpushare.core.model.requests import PodRequest, read_pod
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.allocation import plan
from gpushare.inspect.render import render_details, render_summary
from gpushare.inspect.view import ClusterView, build_view, to_json
from gpushare.kube.objects import gpu_node, gpu_pod
from tests.support.inspecting import mixed_view

SEED_NODE = "cn-zhangjiakou.192.168.66.139"


def seed_view(with_pod: bool) -> ClusterView:
    node = read_node(gpu_node(SEED_NODE, ip="192.168.66.139", gpus_units=[15]))
    ledger = Ledger()
    if with_pod:
        pod = gpu_pod("gpu-share-sample-66191", mem=3)
        pod["metadata"]["uid"] = "u"
        request = read_pod(pod)
        assert isinstance(request, PodRequest)
        ledger.observe({**pod, "metadata": {**pod["metadata"], "annotations": {}}})
        ledger.assume(plan(request, node=SEED_NODE, indexes=[0], unit=MemoryUnit.GiB))
    return build_view([node], ledger)


def test_seed_summary_before_and_after(golden: Callable[[str, str], None]) -> None:
    empty = render_summary(seed_view(False))
    after = render_summary(seed_view(True))
    golden("inspect_seed_empty.txt", empty)
    golden("inspect_seed_3of15.txt", after)
    lines = after.splitlines()
    assert lines[0].split() == ["NAME", "IPADDRESS", "GPU0(Allocated/Total)", "GPU", "Memory(GiB)"]
    assert lines[1].split() == [SEED_NODE, "192.168.66.139", "3/15", "3/15"]
    assert set(lines[2]) == {"-"}
    assert lines[3:] == ["Allocated/Total GPU Memory In Cluster:", "3/15 (20%)"]
    assert empty.splitlines()[-1] == "0/15 (0%)"


def test_details_with_core_and_pending(golden: Callable[[str, str], None]) -> None:
    view = mixed_view()
    golden("inspect_mixed_summary.txt", render_summary(view))
    details = render_details(view)
    golden("inspect_mixed_details.txt", details)
    assert "PENDING(Allocated)" in render_summary(view)
    assert "Core :       80/400% (20%)" in details


def test_json_output(golden: Callable[[str, str], None]) -> None:
    data = to_json(mixed_view())
    golden("inspect_mixed.json", json.dumps(data, indent=2, sort_keys=True) + "\n")
    assert data["cluster"] == {"totalMib": 92160, "allocatedMib": 15360, "allocatedPercent": 16}


def test_128mib_nodes_are_shown_in_mib() -> None:
    node = read_node(gpu_node("n", ip="10.0.0.3", gpus_units=[120], unit=MemoryUnit.MiB128))
    text = render_summary(build_view([node], Ledger(unit=MemoryUnit.MiB128)))
    assert "GPU Memory(MiB)" in text and "0/15360" in text


def test_details_name_the_policy_unit_of_each_pod(golden: Callable[[str, str], None]) -> None:
    share = read_node(gpu_node("pool-a", ip="10.0.0.1", gpus_units=[15]))
    ledger = Ledger()
    for name in ("web-1", "web-2", "batch"):
        pod = gpu_pod(name, mem=3)
        pod["metadata"]["uid"] = name
        request = read_pod(pod)
        assert isinstance(request, PodRequest)
        ledger.assume(plan(request, node="pool-a", indexes=[0], unit=MemoryUnit.GiB))
    units = {"web-1": ("web", 1), "web-2": ("web", 2)}
    view = build_view([share], ledger, units=units)
    details = render_details(view)
    golden("inspect_policy_details.txt", details)
    rows = {line.split()[0]: line.split() for line in details.splitlines() if line}
    assert rows["NAME"][-1] == "POLICY(UNIT)"
    assert rows["web-1"][-1] == "web(1)" and rows["web-2"][-1] == "web(2)"
    assert rows["batch"][-1] == "-"
    pods = {p["name"]: p for p in to_json(view)["nodes"][0]["pods"]}
    assert (pods["web-2"]["resourcePolicy"], pods["web-2"]["policyUnit"]) == ("web", 2)
    assert (pods["batch"]["resourcePolicy"], pods["batch"]["policyUnit"]) == ("", 0)
    # no pod placed by a policy: the column is not there (the seeds' layout)
    assert "POLICY(UNIT)" not in render_details(build_view([share], ledger))
