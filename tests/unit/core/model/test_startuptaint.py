"""The startup taint's decision: keep it while kubelet allocates no GPU memory, then remove it
by key, whatever its effect, and nothing else.

Facts (../shared/docs/AUTOSCALERS.md, "Resources that appear late on a new node"):
cluster-autoscaler 1.36.1 ``utils/taints/taints.go`` ``IsStartupTaint`` matches the key only
(prefix ``startup-taint.cluster-autoscaler.kubernetes.io/``), so either effect makes the node
"starting"; Karpenter v1.15.0 ``pkg/controllers/nodeclaim/lifecycle/initialization.go`` waits
for every NodePool ``startupTaints`` entry to be gone.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpushare.core.model.startuptaint import (
    STARTUP_TAINT,
    Step,
    allocatable_positive,
    key_problem,
    release,
)

MEM = "aliyun.com/gpu-mem"
OTHER = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}


def node(taints: list[dict[str, Any]], allocatable: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "n1", "resourceVersion": "42"},
        "spec": {"taints": taints} if taints else {},
        "status": {"allocatable": {"cpu": "32", **(allocatable or {})}},
    }


def ours(effect: str = "NoSchedule") -> dict[str, Any]:
    return {"key": STARTUP_TAINT, "effect": effect}


def test_the_default_key_is_a_cluster_autoscaler_startup_taint() -> None:
    assert STARTUP_TAINT.startswith("startup-taint.cluster-autoscaler.kubernetes.io/")
    assert key_problem(STARTUP_TAINT) is None


@pytest.mark.parametrize("gpu_mem", [None, "0", 0, "", "nonsense", "-3"])
def test_kept_while_kubelet_allocates_no_gpu_memory(gpu_mem: Any) -> None:
    allocatable = {} if gpu_mem is None else {MEM: gpu_mem}
    decided = release(node([ours()], allocatable), key=STARTUP_TAINT, resource=MEM)
    assert decided.step is Step.WAIT
    assert decided.patch == ()
    assert f"kubelet allocates no {MEM} yet" in decided.reason
    assert STARTUP_TAINT in decided.reason


@pytest.mark.parametrize("effect", ["NoSchedule", "PreferNoSchedule", "NoExecute"])
def test_removed_by_key_whatever_the_effect_and_only_it(effect: str) -> None:
    taints = [OTHER, ours(effect), {"key": "x/y", "effect": "PreferNoSchedule"}]
    decided = release(node(taints, {MEM: "64"}), key=STARTUP_TAINT, resource=MEM)
    assert decided.step is Step.REMOVE
    assert decided.removed == (ours(effect),)
    assert f"{MEM}=64" in decided.reason and effect in decided.reason
    assert list(decided.patch) == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
        {"op": "test", "path": "/spec/taints", "value": taints},
        {"op": "replace", "path": "/spec/taints", "value": [OTHER, taints[2]]},
    ]


def test_the_key_twice_with_two_effects_goes_in_one_write() -> None:
    taints = [ours("NoSchedule"), ours("PreferNoSchedule")]
    decided = release(node(taints, {MEM: "1k"}), key=STARTUP_TAINT, resource=MEM)
    assert decided.step is Step.REMOVE
    assert decided.patch[-1] == {"op": "replace", "path": "/spec/taints", "value": []}


def test_nothing_to_do_without_the_taint_or_without_a_key() -> None:
    done = release(node([OTHER], {MEM: "64"}), key=STARTUP_TAINT, resource=MEM)
    assert done.step is Step.DONE and f"no taint {STARTUP_TAINT}" in done.reason
    assert release(node([]), key=STARTUP_TAINT, resource=MEM).step is Step.DONE
    off = release(node([ours()], {MEM: "64"}), key="", resource=MEM)
    assert off.step is Step.DONE and off.reason == "no startup taint configured"


def test_a_key_that_only_shares_the_prefix_is_not_ours() -> None:
    other = {"key": "startup-taint.cluster-autoscaler.kubernetes.io/cni", "effect": "NoSchedule"}
    decided = release(node([other], {MEM: "64"}), key=STARTUP_TAINT, resource=MEM)
    assert decided.step is Step.DONE


def test_the_configured_resource_name_is_the_one_read() -> None:
    renamed = node([ours()], {MEM: "64", "example.com/gpu-mem": "0"})
    assert release(renamed, key=STARTUP_TAINT, resource="example.com/gpu-mem").step is Step.WAIT
    assert allocatable_positive(renamed, MEM)
    assert not allocatable_positive(renamed, "example.com/gpu-mem")


def test_without_a_resource_version_only_the_taints_are_tested() -> None:
    read = node([ours()], {MEM: 4})
    del read["metadata"]["resourceVersion"]
    decided = release(read, key=STARTUP_TAINT, resource=MEM)
    assert [op["path"] for op in decided.patch] == ["/spec/taints", "/spec/taints"]


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("", None),
        ("gpushare", None),
        ("example.com/gpu-ready", None),
        ("Example.com/x", "prefix 'Example.com' is not a DNS subdomain"),
        ("example.com/", "name '' must be 1 to 63 characters"),
        ("a/-b", "beginning and ending alphanumeric"),
        ("a/b c", "may hold only letters, digits"),
        ("a/" + "b" * 64, "1 to 63 characters"),
    ],
)
def test_key_problems_name_the_part_and_the_rule(key: str, problem: str | None) -> None:
    found = key_problem(key)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found
