"""Placeholders: the refused GPU demand packed GPU by GPU into pods only a new node fits."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpushare.core.autoscaling.placeholders import (
    ANN_FOR,
    HOSTNAME,
    PLACEHOLDER_SCHEDULER,
    Placeholder,
    PlaceholderSettings,
    mark_status,
    plan,
)
from gpushare.core.autoscaling.shortfall import Shortfall, Shortfalls
from gpushare.kube.objects import gpu_pod

GIB = 1024
NOW = 1_700_000_000 * 10**9
SETTINGS = PlaceholderSettings(namespace="gpushare")


def _pods(count: int, mem: int, **kwargs: Any) -> dict[str, dict[str, Any]]:
    pods = {}
    for i in range(count):
        pod = gpu_pod(f"p{i}", mem=mem, **kwargs)
        pod["metadata"]["uid"] = f"uid-{i}"
        pods[f"uid-{i}"] = pod
    return pods


def _short(
    pods: dict[str, dict[str, Any]], gpu_mib: int = 16 * GIB, newest: float = 100.0
) -> list[Shortfall]:
    return [
        Shortfall(
            uid=uid,
            namespace=p["metadata"]["namespace"],
            name=p["metadata"]["name"],
            gpu_mib=gpu_mib,
            newest_node_s=newest,
            since_ns=NOW - 10 * 10**9,
        )
        for uid, p in pods.items()
    ]


def _gpus(step: Any) -> int:
    return sum(p.gpus for p in step.create)


def test_the_trap_pod_gets_one_placeholder_that_no_existing_node_fits() -> None:
    pods = _pods(1, 8)
    step = plan(_short(pods), pods, [], ["n0", "n1"], SETTINGS, now_ns=NOW)
    assert len(step.create) == 1
    body = step.create[0].manifest
    spec = body["spec"]
    assert body["metadata"]["namespace"] == "gpushare"
    assert spec["schedulerName"] == PLACEHOLDER_SCHEDULER
    assert spec["containers"][0]["resources"]["requests"] == {"aliyun.com/gpu-count": "1"}
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n0", "n1"]}]}
    ]
    assert body["metadata"]["annotations"][ANN_FOR] == "uid-0"
    assert step.covered == {"uid-0": step.create[0].name}


@pytest.mark.parametrize(
    ("count", "mem", "gpus"),
    [
        (5, 10, 5),  # 10 GiB pods: one per 16 GiB GPU (CA by totals counts 6 a node)
        (12, 5, 4),  # three 5 GiB pods a GPU
        (4, 16, 4),
        (7, 3, 2),  # five 3 GiB pods a GPU
    ],
)
def test_the_estimate_is_gpu_by_gpu(count: int, mem: int, gpus: int) -> None:
    pods = _pods(count, mem)
    step = plan(_short(pods), pods, [], ["n0"], SETTINGS, now_ns=NOW)
    assert _gpus(step) == gpus
    assert set(step.covered) == set(pods)


def test_pods_of_other_constraints_never_share_a_gpu() -> None:
    pods = _pods(2, 4)
    pods["uid-1"]["spec"]["nodeSelector"] = {"pool": "b"}
    step = plan(_short(pods), pods, [], ["n0"], SETTINGS, now_ns=NOW)
    assert _gpus(step) == 2
    selectors = sorted(str(p.manifest["spec"].get("nodeSelector")) for p in step.create)
    assert selectors == ["None", "{'pool': 'b'}"]


def test_the_pods_own_affinity_and_tolerations_are_kept() -> None:
    pods = _pods(1, 4)
    term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    pods["uid-0"]["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    term,
                    {"matchFields": [{"key": "x", "operator": "In", "values": ["y"]}]},
                ]
            }
        }
    }
    pods["uid-0"]["spec"]["tolerations"] = [{"key": "gpu", "operator": "Exists"}]
    step = plan(_short(pods), pods, [], ["n0"], SETTINGS, now_ns=NOW)
    spec = step.create[0].manifest["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    not_in = {"key": "metadata.name", "operator": "NotIn", "values": ["n0"]}
    assert terms[0] == {**term, "matchFields": [not_in]}
    # every ORed term excludes the old nodes, beside its own fields
    assert terms[1]["matchFields"] == [{"key": "x", "operator": "In", "values": ["y"]}, not_in]
    assert spec["tolerations"] == [{"key": "gpu", "operator": "Exists"}]


def test_a_multi_gpu_pod_asks_for_all_its_gpus_in_one_placeholder() -> None:
    pods = _pods(1, 16, gpu_count="2")
    step = plan(_short(pods), pods, [], ["n0"], SETTINGS, now_ns=NOW)
    assert [p.gpus for p in step.create] == [2]
    requests = step.create[0].manifest["spec"]["containers"][0]["resources"]["requests"]
    assert requests == {"aliyun.com/gpu-count": "2"}


def test_a_burst_is_planned_once_it_settles() -> None:
    pods = _pods(2, 4)
    fresh = [
        Shortfall(s.uid, s.namespace, s.name, s.gpu_mib, s.newest_node_s, NOW) for s in _short(pods)
    ]
    assert plan(fresh, pods, [], ["n0"], SETTINGS, now_ns=NOW).create == ()
    later = plan(fresh, pods, [], ["n0"], SETTINGS, now_ns=NOW + 5 * 10**9)
    assert _gpus(later) == 1


def test_an_existing_placeholder_stands_until_its_pods_bind_or_a_newer_node_refuses_them() -> None:
    pods = _pods(1, 8)
    short = _short(pods, newest=100.0)
    held = Placeholder("gpushare-placeholder-a", "ph-uid", ("uid-0",), created_s=200.0, marked=True)
    kept = plan(short, pods, [held], ["n0", "n1"], SETTINGS, now_ns=NOW)
    assert kept.create == () and kept.delete == () and kept.covered == {"uid-0": held.name}

    gone = plan([], {}, [held], ["n0"], SETTINGS, now_ns=NOW)  # the pod bound
    assert gone.delete == (held,)

    newer = _short(pods, newest=300.0)  # refused by a node that joined after the placeholder
    again = plan(newer, pods, [held], ["n0", "n1"], SETTINGS, now_ns=NOW)
    assert again.delete == (held,)
    assert len(again.create) == 1 and again.create[0].name != held.name
    values = again.create[0].manifest["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"][0]["matchFields"][0]["values"]
    assert values == ["n0", "n1"]


def test_an_unmarked_placeholder_is_marked_again() -> None:
    pods = _pods(1, 8)
    held = Placeholder("gpushare-placeholder-a", "ph-uid", ("uid-0",), 200.0, marked=False)
    assert plan(_short(pods), pods, [held], ["n0"], SETTINGS, now_ns=NOW).mark == (held.name,)
    patch = mark_status(["default/p0"])
    condition = patch["status"]["conditions"][0]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "PodScheduled",
        "False",
        "Unschedulable",
    )


def test_limits_hold_and_say_why() -> None:
    pods = _pods(6, 16)
    capped = PlaceholderSettings(namespace="gpushare", limit=2, per_namespace=4)
    step = plan(_short(pods), pods, [], ["n0"], capped, now_ns=NOW)
    assert len(step.create) == 2
    assert len(step.left) == 4
    assert any("autoscaling.perNamespace" in why for why in step.left.values())
    assert any("autoscaling.maxPlaceholders" in why for why in step.left.values())


def test_an_unknown_gpu_size_is_left_to_the_autoscaler_unless_configured() -> None:
    pods = _pods(1, 4)
    step = plan(_short(pods, gpu_mib=0), pods, [], [], SETTINGS, now_ns=NOW)
    assert step.create == () and "newNodeGpuMemoryMiB" in step.left["default/p0"]
    sized = PlaceholderSettings(namespace="gpushare", new_node_gpu_mib=16 * GIB)
    assert _gpus(plan(_short(pods, gpu_mib=0), pods, [], [], sized, now_ns=NOW)) == 1


def test_bad_settings_name_the_value() -> None:
    with pytest.raises(ValueError, match=r"autoscaling\.maxPlaceholders=-1"):
        PlaceholderSettings(namespace="x", limit=-1)


def test_the_book_keeps_the_first_refusal_of_a_row_and_is_bounded() -> None:
    book = Shortfalls(limit=2)
    book.refused(Shortfall("a", "ns", "a", 1, 0.0, since_ns=5))
    book.refused(Shortfall("a", "ns", "a", 1, 0.0, since_ns=9))
    assert book.get("a") is not None and book.get("a").since_ns == 5  # type: ignore[union-attr]
    book.refused(Shortfall("b", "ns", "b", 1, 0.0, since_ns=9))
    book.refused(Shortfall("c", "ns", "c", 1, 0.0, since_ns=9))
    assert "a" not in book and len(book) == 2


def test_a_pod_still_pending_but_not_refused_keeps_its_placeholder_for_a_grace() -> None:
    """After a restart the book is empty until kube-scheduler tries the pods again: their
    placeholders stay, so nothing is deleted and made again while a node is coming."""
    pods = _pods(1, 8)
    held = Placeholder("gpushare-placeholder-a", "ph-uid", ("uid-0",), 200.0, marked=True)
    kept = plan([], pods, [held], ["n0"], SETTINGS, now_ns=NOW, quiet={"uid-0": NOW - 10**9})
    assert kept.delete == () and kept.create == ()
    late = NOW - int(SETTINGS.grace_s * 1e9) - 1
    assert plan([], pods, [held], ["n0"], SETTINGS, now_ns=NOW, quiet={"uid-0": late}).delete == (
        held,
    )


def test_for_karpenter_placeholders_keep_off_published_nodes_by_label() -> None:
    """Karpenter ignores pods whose affinity names kubernetes.io/hostname (IsRestrictedLabel,
    sigs.k8s.io/karpenter v1.15.0 pkg/apis/v1/labels.go)."""
    pods = _pods(1, 8)
    karpenter = PlaceholderSettings(namespace="gpushare", exclusion="label")
    step = plan(_short(pods), pods, [], ["n0"], karpenter, now_ns=NOW)
    terms = step.create[0].manifest["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [
        {"matchExpressions": [{"key": "gpushare.io/gpus-published", "operator": "DoesNotExist"}]}
    ]
    assert HOSTNAME not in json.dumps(step.create[0].manifest)
    with pytest.raises(ValueError, match="hostname, label"):
        PlaceholderSettings(namespace="x", exclusion="zone")
