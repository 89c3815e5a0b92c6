"""``kubectl inspect cgpu`` narrowed (-n, -l, -A) and as a tenant with namespace rights only."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import yaml

from gpushare.core.model.requests import PodRequest, read_pod
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.allocation import plan
from gpushare.inspect.cli import collect, render
from gpushare.inspect.scope import Scope, parse_selector
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod, placed
from gpushare.kube.port import Forbidden
from gpushare.kube.sealing import keyless_trust


def place(
    kube: MemoryKube, name: str, namespace: str, mem: int, node: str, index: int, **labels: str
) -> None:
    pod: dict[str, Any] = gpu_pod(name, mem=mem, namespace=namespace)
    pod["metadata"]["uid"] = f"uid-{namespace}-{name}"
    pod["metadata"]["labels"] = labels
    pod["status"] = {"phase": "Running", "hostIP": {"n1": "10.0.0.1", "n2": "10.0.0.2"}[node]}
    request = read_pod(pod)
    assert isinstance(request, PodRequest)
    allocation = plan(request, node=node, indexes=[index], unit=MemoryUnit.GiB)
    kube.create_pod(placed(pod, allocation, trust=keyless_trust(kube)))


def cluster() -> MemoryKube:
    kube = MemoryKube()
    kube.put_node(gpu_node("n1", ip="10.0.0.1", gpus_units=[15, 15]))
    kube.put_node(gpu_node("n2", ip="10.0.0.2", gpus_units=[15]))
    place(kube, "train", "team-a", 3, "n1", 1, app="train")
    place(kube, "serve", "team-a", 2, "n1", 1, app="serve")
    place(kube, "infer", "team-b", 8, "n2", 0, app="train")
    place(kube, "third", "team-b", 4, "n1", 0, app="x")
    return kube


def text(
    kube: MemoryKube, *, details: bool = False, output: str = "text", home: str = "", **scope: Any
) -> str:
    view = asyncio.run(collect(kube, scope=Scope(**scope), home=home))
    return render(view, details=details, output=output)


def test_the_whole_cluster_is_the_seeds_view() -> None:
    out = text(cluster())
    assert "n1    10.0.0.1   4/15" in out and "Allocated/Total GPU Memory In Cluster:" in out
    assert "Shown:" not in out and "Note:" not in out


def test_a_namespace_shows_its_pods_and_their_nodes_full() -> None:
    out = text(cluster(), details=True, namespace="team-a")
    assert "NAME:       n1" in out and "NAME:       n2" not in out
    assert "train" in out and "serve" in out and "third" not in out
    assert "Allocated :  9 (30%)" in out  # team-b's 4 GiB on n1 still count
    assert "Allocated/Total GPU Memory On The Nodes Shown:" in out
    assert "Shown: the pods of namespace team-a, and the nodes they are on." in out


def test_a_selector_picks_pods_across_namespaces() -> None:
    kube = cluster()
    out = text(kube, details=True, selector=parse_selector("app=train"))
    assert "train" in out and "infer" in out and "serve" not in out and "third" not in out
    data = json.loads(text(kube, output="json", selector=parse_selector("app in (serve)")))
    assert [n["name"] for n in data["nodes"]] == ["n1"]
    assert [p["name"] for p in data["nodes"][0]["pods"]] == ["serve"]
    assert data["scope"] == {"namespace": "", "selector": "app in (serve)", "forbidden": []}


def test_a_tenant_without_node_or_cluster_rights_sees_its_namespace() -> None:
    kube = cluster()
    kube.forbidden |= {"list_nodes", "list_pods:*", "get_secret"}
    out = text(kube, home="team-a")
    print(out)
    assert out.splitlines()[:2] == [
        "NAME  IPADDRESS  GPU0(Allocated/Total)  GPU1(Allocated/Total)  GPU Memory(GiB)",
        "n1    10.0.0.1   ?                      5/15                   5/15",
    ]
    assert "Note: pods outside namespace team-a: forbidden;" in out
    assert "Note: nodes: forbidden;" in out
    assert "infer" not in out and "n2" not in out
    data = yaml.safe_load(text(kube, output="yaml", home="team-a"))
    assert data["scope"]["forbidden"] == ["nodes", "pods outside namespace team-a"]
    assert data["nodes"][0]["seenFrom"] == "pods" and data["nodes"][0]["mode"] == "none"


def test_a_tenant_who_may_list_nodes_sees_their_gpus() -> None:
    kube = cluster()
    kube.forbidden |= {"list_pods:*"}
    out = text(kube, details=True, home="team-a")
    assert "MODE:       share" in out and "Allocated :  5 (16%)" in out
    assert "Note: nodes: forbidden" not in out and "team-b" not in out


def test_no_namespace_to_fall_back_to_is_an_error() -> None:
    kube = cluster()
    kube.forbidden |= {"list_pods:*"}
    with pytest.raises(Forbidden):
        asyncio.run(collect(kube))


def test_wide_and_no_headers_keep_the_seed_columns() -> None:
    view = asyncio.run(collect(cluster()))
    plain = render(view, details=False, output="text").splitlines()
    wide = render(view, details=False, output="wide").splitlines()
    bare = render(view, details=False, output="text", headers=False).splitlines()
    assert wide[0].endswith("GPU Memory(GiB)  MODE   PODS")
    assert wide[1].startswith(plain[1]) and wide[1].endswith("share  3")
    assert wide[3:] == plain[3:]  # the dashed line and the totals are the seeds'
    assert bare[0] == "n1  10.0.0.1  4/15  5/15  9/30"
    assert bare[2:] == plain[3:]
    details = render(view, details=True, output="text", headers=False)
    assert "NAME  NAMESPACE" not in details and "train  team-a" in details


def test_a_bad_selector_names_the_flag_and_the_term() -> None:
    from click.testing import CliRunner

    from gpushare.inspect.cli import main as inspect_cgpu

    result = CliRunner().invoke(inspect_cgpu, ["-l", "app=web,(x"])
    assert result.exit_code == 2
    assert "Invalid value for -l" in result.output
    assert "'(x' is not a label requirement" in result.output
