"""Shape checks: each problem names its field; whatever passes, the readers can read."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.core.booking.ledger import Ledger
from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.core.model.inventory import read_node
from gpushare.core.model.requests import read_pod
from gpushare.core.model.shape import json_kind, node_shape, pod_shape, render_path
from gpushare.kube.objects import gpu_node, gpu_pod

MEM = "aliyun.com/gpu-mem"
CORE = "aliyun.com/gpu-core.percentage"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly the right type, sometimes any JSON value in its place."""
    return st.one_of(strategy, strategy, json_values)


def objects(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional=fields)


names = st.text("abc-", min_size=1, max_size=4)
quantities = st.one_of(
    st.integers(-5, 40), st.sampled_from(["3", "+3", "3e0", "1.5", "3Gi", "", "x"]), json_values
)
resource_maps = st.dictionaries(st.sampled_from([MEM, CORE, "cpu"]), quantities, max_size=3)
containers = maybe(
    objects(
        name=maybe(names),
        restartPolicy=maybe(st.sampled_from(["Always", "Never"])),
        resources=maybe(objects(limits=maybe(resource_maps), requests=maybe(resource_maps))),
    )
)
string_maps = st.dictionaries(
    st.sampled_from(["aliyun.com/gpu-count", "app"]), maybe(st.sampled_from(["2", "x"]))
)
metadata = maybe(
    objects(
        name=maybe(names),
        namespace=maybe(names),
        uid=maybe(names),
        labels=maybe(string_maps),
        annotations=maybe(string_maps),
    )
)
pods = maybe(
    objects(
        metadata=metadata,
        spec=maybe(
            objects(
                containers=maybe(st.lists(containers, max_size=3)),
                initContainers=maybe(st.lists(containers, max_size=2)),
                nodeName=maybe(names),
            )
        ),
    )
)
capacities = st.dictionaries(st.sampled_from([MEM, "aliyun.com/gpu-count"]), quantities)
nodes = maybe(
    objects(
        metadata=metadata,
        status=maybe(
            objects(
                capacity=maybe(capacities),
                allocatable=maybe(capacities),
                addresses=maybe(
                    st.lists(maybe(objects(type=st.just("InternalIP"), address=maybe(names))))
                ),
            )
        ),
    )
)


def value_at(obj: Any, path: tuple[str | int, ...]) -> Any:
    for step in path:
        obj = obj[step]
    return obj


@settings(max_examples=300, deadline=None)
@given(pods)
def test_a_pod_of_good_shape_is_always_read_and_a_bad_one_is_named(pod: Any) -> None:
    problem = pod_shape(pod)
    if problem is None:
        read_pod(pod)  # a value, never an exception
        scheduler = Scheduler(Settings())
        scheduler.filter(pod, [read_node(gpu_node("n"))], Ledger())
        return
    if problem.got == "nothing":
        assert problem.path[-1] not in value_at(pod, problem.path[:-1])
    else:  # the path leads to the offending value
        assert json_kind(value_at(pod, problem.path)) == problem.got
    assert problem.message("Pod").startswith(render_path("Pod", problem.path) + ": expected ")


@settings(max_examples=300, deadline=None)
@given(nodes)
def test_a_node_of_good_shape_is_always_read(node: Any) -> None:
    if node_shape(node) is None:
        read_node(node)


def test_objects_as_kubernetes_writes_them_pass() -> None:
    assert pod_shape(gpu_pod("p", mem=3, core=30)) is None
    assert node_shape(gpu_node("n", gpus_units=[15, 15])) is None
    assert pod_shape({}) is None  # nothing asked for, nothing to read


@pytest.mark.parametrize(
    ("pod", "message"),
    [
        ({"spec": {"containers": None}}, "Pod.spec.containers: expected a list, got null"),
        ({"spec": {"containers": [[]]}}, "Pod.spec.containers[0]: expected an object, got a list"),
        ({"metadata": {"uid": 7}}, "Pod.metadata.uid: expected a string, got a number"),
        (
            {"metadata": {"annotations": {"a": True}}},
            "Pod.metadata.annotations.a: expected a string, got a boolean",
        ),
        ("pod", "Pod: expected an object, got a string"),
    ],
)
def test_messages_name_the_field_and_the_rule(pod: Any, message: str) -> None:
    problem = pod_shape(pod)
    assert problem is not None and problem.message("Pod") == message


def test_a_node_needs_a_name() -> None:
    problem = node_shape({"metadata": {"name": ""}})
    assert problem is not None
    assert problem.message() == "metadata.name: expected a non-empty string, got an empty string"
