"""ResourcePolicy: reading the spec, and which unit is open to a pod."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare.core.resourcepolicies.gating import (
    ANN_POLICY,
    ANN_UNIT,
    Placed,
    decide,
    deletion_cost,
)
from gpushare.core.resourcepolicies.policybook import PolicyBook, recorded_units
from gpushare.core.resourcepolicies.resourcepolicy import (
    InvalidResourcePolicy,
    NextPolicy,
    ResourcePolicy,
    Unit,
    parse_duration,
    read_policy,
)
from tests.support.policies import policy_obj

NODES = {"a1": {"pool": "a"}, "a2": {"pool": "a"}, "b1": {"pool": "b"}, "x": {}}


def policy(**spec: Any) -> ResourcePolicy:
    read = read_policy(policy_obj(**spec))
    assert isinstance(read, ResourcePolicy), read
    return read


def on(node: str, n: int, **kw: Any) -> list[Placed]:
    return [
        Placed(uid=f"{node}-{i}", namespace="default", labels={"app": "web"}, node=node, **kw)
        for i in range(n)
    ]


def gate(p: ResourcePolicy, placed: list[Placed], fitting: list[str], **kw: Any) -> Any:
    args: dict[str, Any] = {
        "uid": "me",
        "labels": {"app": "web"},
        "created": "2026-01-01T00:10:00Z",
        "placed": placed,
        "node_labels": NODES,
        "fitting": fitting,
        "now_s": 1767226200.0,  # 2026-01-01T00:10:00Z
    }
    args.update(kw)
    return decide(p, **args)


def test_reads_acks_fields() -> None:
    p = policy(
        whenTryNextUnits={"policy": "TimeoutOrExceedMax", "timeout": "1m30s"},
        preemptPolicy="BeforeNextUnit",
        ignorePreviousPod=True,
        ignoreTerminatingPod=False,
        matchLabelKeys=["pod-template-hash"],
    )
    assert p.next_policy is NextPolicy.TIMEOUT_OR_EXCEED_MAX
    assert p.timeout_s == 90
    assert p.ignore_previous_pods and not p.ignore_terminating_pods
    assert p.match_label_keys == ("pod-template-hash",)
    assert [u.max_pods for u in p.units] == [2, None]


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (
            {"units": [{"resource": "eci"}]},
            ["spec.units[0].resource is 'eci'", "resource ecs", "Remove this unit"],
        ),
        ({"units": [{"resource": "ecs", "nodeSelector": {"p": "a"}, "max": -1}]}, ["max", "-1"]),
        ({"units": [{"resource": "ecs"}]}, ["spec.units[0].nodeSelector", "needs a nodeSelector"]),
        ({"strategy": "required"}, ["spec.strategy is 'required'", "prefer"]),
        ({"whenTryNextUnits": {"policy": "Sometimes"}}, ["'Sometimes'", "ExceedMax"]),
        ({"whenTryNextUnits": {"timeout": "soon"}}, ["timeout is 'soon'", "5m"]),
        ({"selector": {}}, ["spec.selector", "at least one pod label"]),
    ],
)
def test_bad_specs_say_field_value_and_rule(spec: dict[str, Any], words: list[str]) -> None:
    read = read_policy(policy_obj(**spec))
    assert isinstance(read, InvalidResourcePolicy)
    for word in words:
        assert word in read.message
    assert read.message.startswith("ResourcePolicy default/web: ")


def test_durations() -> None:
    assert parse_duration("15m") == 900
    assert parse_duration("1h2m3s") == 3723
    assert parse_duration("10") is None


def test_first_unit_while_it_has_room() -> None:
    g = gate(policy(), on("a1", 1), ["a1", "a2", "b1"])
    assert g.chosen is not None and g.chosen.number == 1
    assert g.allows(NODES["a2"]) and not g.allows(NODES["b1"])


def test_overflow_when_first_unit_full() -> None:
    g = gate(policy(), on("a1", 1) + on("a2", 1), ["a1", "a2", "b1"])
    assert g.chosen is not None and g.chosen.number == 2
    assert g.allows(NODES["b1"]) and not g.allows(NODES["a1"])
    assert "unit 1 (nodeSelector pool=a) is full: 2/2 pods" in g.reason
    assert g.passed == ("unit 1 (nodeSelector pool=a) is full: 2/2 pods",)


def test_lack_of_resource_moves_on_by_default() -> None:
    g = gate(policy(), [], ["b1"])
    assert g.chosen is not None and g.chosen.number == 2
    assert "has 0 pods (max 2) and no node for this pod now" in g.reason


def test_exceed_max_waits_for_the_unit() -> None:
    g = gate(policy(whenTryNextUnits={"policy": "ExceedMax"}), [], ["b1"])
    assert g.chosen is not None and g.chosen.number == 1
    assert not g.allows(NODES["b1"])
    assert "waiting for unit 1" in g.reason and "ExceedMax" in g.reason


def test_timeout_waits_then_moves_on() -> None:
    p = policy(whenTryNextUnits={"policy": "TimeoutOrExceedMax", "timeout": "5m"})
    young = gate(p, [], ["b1"], now_s=1767226200.0 + 60)
    assert young.chosen is not None and young.chosen.number == 1
    assert "240s left" in young.reason
    old = gate(p, [], ["b1"], now_s=1767226200.0 + 301)
    assert old.chosen is not None and old.chosen.number == 2


def test_exceed_max_passes_a_unit_without_max() -> None:
    p = policy(
        units=[{"nodeSelector": {"pool": "a"}}, {"nodeSelector": {"pool": "b"}}],
        whenTryNextUnits={"policy": "ExceedMax"},
    )
    g = gate(p, [], ["b1"])
    assert g.chosen is not None and g.chosen.number == 2
    assert g.passed == (
        "unit 1 (nodeSelector pool=a) has 0 pods (no max) and no node for this pod now",
    )


def test_wait_for_scaling_label_makes_a_unit_without_max_wait() -> None:
    wait = {"k8s.aliyun.com/resource-policy-wait-for-ecs-scaling": "true", "tier": "a"}
    units = [{"nodeSelector": {"pool": "a"}, "podLabels": wait}, {"nodeSelector": {"pool": "b"}}]
    p = policy(units=units, whenTryNextUnits={"policy": "TimeoutOrExceedMax", "timeout": "1m"})
    assert p.units[0].waits_for_scaling and p.units[0].pod_labels == {"tier": "a"}
    young = gate(p, [], ["b1"], now_s=1767226200.0 + 10)
    assert young.chosen is not None and young.chosen.number == 1
    assert "podLabels ask to wait for scaling" in young.reason and "50s left" in young.reason
    old = gate(p, [], ["b1"], now_s=1767226200.0 + 61)
    assert old.chosen is not None and old.chosen.number == 2
    assert "older than whenTryNextUnits timeout 60s" in old.passed[0]
    # without the label, a unit without max is passed at once
    plain = policy(
        units=[{"nodeSelector": {"pool": "a"}}, {"nodeSelector": {"pool": "b"}}],
        whenTryNextUnits={"policy": "TimeoutOrExceedMax"},
    )
    assert gate(plain, [], ["b1"]).chosen.number == 2  # type: ignore[union-attr]


def test_last_unit_waits_without_naming_a_next_one() -> None:
    p = policy(
        units=[{"nodeSelector": {"pool": "a"}, "max": 5}],
        whenTryNextUnits={"policy": "ExceedMax"},
    )
    g = gate(p, [], [])
    assert "(the last unit)" in g.reason and "unit 2" not in g.reason


@pytest.mark.parametrize(
    "spelling", ["LackResourceAndNoTerminating", "LackResourceAndNoterminating"]
)
def test_no_terminating_waits_while_the_units_pods_terminate(spelling: str) -> None:
    p = policy(whenTryNextUnits={"policy": spelling})
    assert p.next_policy is NextPolicy.LACK_RESOURCE_AND_NO_TERMINATING
    # one old pod of another revision being deleted in pool a: wait for it, though a has room
    dying = [
        Placed(
            uid="old",
            namespace="default",
            labels={"app": "web", "rev": "1"},
            node="a1",
            terminating=True,
        )
    ]
    g = gate(p, dying, ["b1"])
    assert g.chosen is not None and g.chosen.number == 1 and not g.allows(NODES["b1"])
    assert "1 of the policy's pods there are terminating" in g.reason
    # full and terminating: wait, with no node of the full unit open
    full = on("a1", 2) + dying
    g = gate(p, full, ["a2", "b1"])
    assert g.chosen is None and not g.allows(NODES["a2"]) and not g.allows(NODES["b1"])
    assert "2/2 pods, full" in g.reason
    # nothing terminating: go on, as LackResourceOrExceedMax does
    assert gate(p, on("a1", 2), ["a2", "b1"]).chosen.number == 2  # type: ignore[union-attr]
    assert gate(p, [], ["b1"]).chosen.number == 2  # type: ignore[union-attr]


def test_before_next_unit_is_accepted_with_a_notice() -> None:
    assert policy().notices == ()
    (notice,) = policy(preemptPolicy="BeforeNextUnit").notices
    assert "spec.preemptPolicy BeforeNextUnit has no effect" in notice
    assert notice.startswith("ResourcePolicy default/web: ")


def test_all_full_means_no_unit() -> None:
    p = policy(
        units=[{"nodeSelector": {"pool": "a"}, "max": 1}, {"nodeSelector": {"pool": "b"}, "max": 1}]
    )
    g = gate(p, on("a1", 1) + on("b1", 1), ["a1", "b1"])
    assert g.chosen is None and not g.allows(NODES["a1"])
    assert "no unit open" in g.reason and "unit 2 (nodeSelector pool=b) is full: 1/1" in g.reason


def test_counting_flags() -> None:
    p = policy(ignorePreviousPod=True)
    older = on("a1", 2, created="2025-12-31T00:00:00Z")
    assert gate(p, older, ["a1"]).chosen.number == 1  # type: ignore[union-attr]
    assert gate(policy(), older, ["a1", "b1"]).chosen.number == 2  # type: ignore[union-attr]
    dying = on("a1", 2, terminating=True)
    assert gate(policy(), dying, ["a1"]).chosen.number == 1  # type: ignore[union-attr]
    counted = policy(ignoreTerminatingPod=False)
    assert gate(counted, dying, ["a1", "b1"]).chosen.number == 2  # type: ignore[union-attr]
    me = [Placed(uid="me", namespace="default", labels={"app": "web"}, node="a1")] * 2
    assert gate(policy(), me, ["a1"]).chosen.number == 1  # type: ignore[union-attr]
    others = [
        Placed(uid=f"o{i}", namespace="other", labels={"app": "web"}, node="a1") for i in range(2)
    ]
    assert gate(policy(), others, ["a1"]).chosen.number == 1  # type: ignore[union-attr]


def test_match_label_keys_count_per_group() -> None:
    p = policy(matchLabelKeys=["rev"])
    old = [
        Placed(uid=f"o{i}", namespace="default", labels={"app": "web", "rev": "1"}, node="a1")
        for i in range(2)
    ]
    g = gate(p, old, ["a1", "b1"], labels={"app": "web", "rev": "2"})
    assert g.chosen.number == 1  # type: ignore[union-attr]
    g = gate(p, old, ["a1", "b1"], labels={"app": "web", "rev": "1"})
    assert g.chosen.number == 2  # type: ignore[union-attr]
    lacking = gate(p, old, ["a1"], labels={"app": "web"})
    assert lacking.chosen is None and "no label 'rev'" in lacking.error
    assert not lacking.allows(NODES["a1"])


def test_recorded_unit_wins_while_the_node_is_in_it() -> None:
    p = policy(
        units=[{"nodeSelector": {"pool": "a"}, "max": 1}, {"nodeSelector": {"pool": "a"}, "max": 5}]
    )
    recorded = on("a1", 1, policy="web", unit=2)
    assert gate(p, recorded, ["a1"]).chosen.number == 1  # type: ignore[union-attr]
    unrecorded = on("a1", 1)
    assert gate(p, unrecorded, ["a1"]).chosen.number == 2  # type: ignore[union-attr]


def test_deletion_cost_falls_with_the_unit() -> None:
    p = policy()
    assert [deletion_cost(u) for u in p.units] == [0, -1]


def pod(name: str, node: str = "", **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": name,
            "labels": {"app": "web"},
            **meta,
        },
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": "Running" if node else "Pending"},
    }


def test_book_counts_bound_and_assumed_pods() -> None:
    book = PolicyBook()
    book.replace_nodes([{"metadata": {"name": n, "labels": lab}} for n, lab in NODES.items()])
    book.put_policy(policy_obj())
    book.observe_pod(pod("p1", "a1"))
    first = book.gate(pod("p2"), fitting=["a1", "b1"], now_s=0)
    assert first is not None and first.chosen is not None and first.chosen.number == 1
    book.assume(book.placement(pod("p2"), "a2", first))
    # the bind's annotation patch arrives as an unbound pod: the assumption stays
    book.observe_pod(pod("p2", **{"annotations": {ANN_POLICY: "web", ANN_UNIT: "1"}}))
    third = book.gate(pod("p3"), fitting=["a1", "b1"], now_s=0)
    assert third is not None and third.chosen is not None and third.chosen.number == 2
    book.unassume("p2")
    again = book.gate(pod("p3"), fitting=["a1", "b1"], now_s=0)
    assert again is not None and again.chosen is not None and again.chosen.number == 1
    book.observe_pod({**pod("p1", "a1"), "status": {"phase": "Succeeded"}})
    assert book.placed() == []


def test_book_tells_pods_of_an_invalid_policy() -> None:
    book = PolicyBook()
    book.put_policy(policy_obj(units=[{"resource": "elastic"}]))
    g = book.gate(pod("p1"), fitting=["a1"], now_s=0)
    assert g is not None and "spec.units[0].resource is 'elastic'" in g.error
    assert (
        book.gate(
            {**pod("q"), "metadata": {"name": "q", "labels": {"app": "db"}}}, fitting=[], now_s=0
        )
        is None
    )
    book.delete_policy("default", "web")
    assert book.gate(pod("p1"), fitting=["a1"], now_s=0) is None


def test_chart_crd_is_the_rendered_one() -> None:
    from pathlib import Path

    from gpushare.crds import render_yaml, resource_policy_crd

    chart = Path(__file__).parents[4] / "charts/gpushare/crds/resourcepolicies.yaml"
    assert chart.read_text() == render_yaml(resource_policy_crd())
    # every string map spelled out: no anchors or aliases for a reader to chase
    assert "&id" not in chart.read_text() and "*id" not in chart.read_text()


def test_recorded_units_for_inspect() -> None:
    placed = pod("p1", "a1", annotations={ANN_POLICY: "web", ANN_UNIT: "2"})
    odd = pod("p2", "a1", annotations={ANN_POLICY: "web", ANN_UNIT: "two"})
    assert recorded_units([placed, odd, pod("p3", "a1")]) == {"p1": ("web", 2)}
    book = PolicyBook()
    book.observe_pod(placed)
    book.assume(Placed(uid="p4", namespace="default", labels={}, node="b1", policy="web", unit=1))
    assert book.recorded_units() == {"p1": ("web", 2), "p4": ("web", 1)}


def many_units(count: int, pool: str = "none") -> list[dict[str, Any]]:
    return [{"resource": "ecs", "nodeSelector": {"pool": f"{pool}-{i}"}} for i in range(count)]


def test_a_policy_over_the_unit_limit_is_refused_with_the_count_and_the_way_out() -> None:
    assert isinstance(read_policy(policy_obj(units=many_units(100))), ResourcePolicy)
    read = read_policy(policy_obj(units=many_units(101)))
    assert isinstance(read, InvalidResourcePolicy)
    assert read.message.startswith("ResourcePolicy default/web: spec.units lists 101 units")
    assert "at most 100 are allowed" in read.message
    assert "select them with one unit" in read.message
    assert read.selector == {"app": "web"}  # its pods are told


def test_a_refused_value_is_quoted_in_part() -> None:
    read = read_policy(policy_obj(units="x" * 5000))
    assert isinstance(read, InvalidResourcePolicy)
    assert "spec.units is 'xxx" in read.message and "x…: list at least one unit" in read.message
    assert len(read.message) < 400


class _Counted:
    """Counts ``Unit.holds`` calls: the work of matching units to nodes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from gpushare.core.resourcepolicies.resourcepolicy import Unit

        self.calls = 0
        holds = Unit.holds

        def counted(unit: Unit, labels: Any) -> bool:
            self.calls += 1
            return holds(unit, labels)

        monkeypatch.setattr(Unit, "holds", counted)


def test_deciding_tests_about_one_unit_per_node_not_every_unit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nodes = {f"n{i}": {"pool": "gpu", "zone": f"z{i % 3}"} for i in range(200)}
    big = policy(units=[*many_units(99), {"resource": "ecs", "nodeSelector": {"pool": "gpu"}}])
    placed = [p for n in list(nodes)[:50] for p in on(n, 1)]
    counter = _Counted(monkeypatch)
    g = gate(big, placed, list(nodes), node_labels=nodes)
    assert g.chosen is not None and g.chosen.number == 100
    assert g.states[-1].fitting == 200 and g.states[-1].pods == 50
    # before: every unit against every fitting node and every placed pod's node (25,000)
    assert counter.calls <= len(nodes) + len(placed) + len(big.units)


def test_the_reason_names_three_passed_units_and_counts_the_rest() -> None:
    big = policy(units=many_units(100))
    g = gate(big, [], ["a1", "b1"])
    assert g.chosen is None
    assert g.reason.startswith(
        "ResourcePolicy default/web has no unit open to this pod: unit 1 (nodeSelector "
        "pool=none-0) has 0 pods (no max) and no node for this pod now; unit 2"
    )
    assert g.reason.endswith("; and 97 more units, each full or with no node for this pod")
    assert len(g.passed) == 100  # all kept for whoever wants them, only the reason is short


def test_a_reason_is_cut_whatever_a_selector_holds() -> None:
    long = {f"label-{i}": "v" * 50 for i in range(40)}
    big = policy(units=[{"resource": "ecs", "nodeSelector": long}])
    g = gate(big, [], ["a1"])
    assert len(g.reason) <= 1000 and g.reason.endswith("…")


@given(
    st.lists(
        st.dictionaries(st.sampled_from("abc"), st.sampled_from("xy"), min_size=1), min_size=1
    ),
    st.dictionaries(st.sampled_from("abcd"), st.sampled_from("xyz")),
)
def test_the_unit_index_finds_exactly_the_units_that_hold_a_node(
    selectors: list[dict[str, str]], labels: dict[str, str]
) -> None:
    from gpushare.core.resourcepolicies.resourcepolicy import UnitIndex

    units = [Unit(number=i, node_selector=s) for i, s in enumerate(selectors, start=1)]
    holding = [u for u in units if u.holds(labels)]
    assert UnitIndex(units).holding(labels) == holding
    assert UnitIndex(units).first_holding(labels) == (holding[0] if holding else None)


def test_the_crd_limits_the_units() -> None:
    from gpushare.crds import resource_policy_crd

    schema = resource_policy_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert schema["properties"]["spec"]["properties"]["units"]["maxItems"] == 100


def test_a_decision_looks_only_at_the_pods_of_its_namespace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    book = PolicyBook()
    book.put_policy(policy_obj())
    book.node_labels = dict(NODES)
    for i in range(300):
        book.observe_pod(pod(f"o{i}", "a1", namespace="other"))
    book.observe_pod(pod("p1", "a1"))
    book.assume(Placed(uid="p2", namespace="default", labels={"app": "web"}, node="a2"))
    book.assume(Placed(uid="o-new", namespace="other", labels={"app": "web"}, node="a2"))
    calls = 0
    selects = ResourcePolicy.selects

    def counted(self: ResourcePolicy, namespace: str, labels: Any) -> bool:
        nonlocal calls
        calls += 1
        return selects(self, namespace, labels)

    monkeypatch.setattr(ResourcePolicy, "selects", counted)
    g = book.gate(pod("me"), fitting=["a1", "a2", "b1"], now_s=0)
    assert g is not None and g.chosen is not None and g.chosen.number == 2  # p1, p2 fill unit 1
    assert calls <= 4  # before: every pod of the cluster, twice (604)
    assert {p.uid for p in book.placed("default")} == {"p1", "p2"}
    assert len(book.placed()) == 303
    book.forget_pod("p1")
    book.retain_pods({"o0"})
    assert [p.uid for p in book.placed()] == ["o0"]
