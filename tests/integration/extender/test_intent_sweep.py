"""The extender's sweep: intents never outlive their deadline, refused pods come back with the GPUs.

Random interleavings of filter calls (each may book an intent, be refused, or give back the
pod's own intent), clock ticks and sweeps, with no bind ever coming (pods that wait in PreBind
for a volume never provisioned): after every sweep no intent is past its deadline, whatever
calls came or did not; and every pod refused before GPUs came back, and not tried since, has
been handed out to be tried again, each once per refusal.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.extender.intents import LAG_S
from gpushare.extender.wire import read_args
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod
from tests.support.rig import Rig, binding, run_with_rig

PODS = 6
START = 1_700_000_000 * 10**9

steps = st.lists(
    st.one_of(
        st.tuples(st.just("filter"), st.integers(0, PODS - 1)),
        st.tuples(st.just("filter"), st.integers(0, PODS - 1)),
        st.tuples(st.just("tick"), st.sampled_from([1, 15, 31])),
        st.tuples(st.just("sweep"), st.just(0)),
    ),
    min_size=6,
    max_size=40,
)


def _expired(rig: Rig) -> float:
    """Intents that brought GPUs back with no bind: run out, past their hold (they give way to
    a pod that fits nowhere else: ``core.decision.yielding``), or given way."""
    intents = rig.extender.metrics.intents
    value: float = sum(
        intents.labels(outcome)._value.get() for outcome in ("expired", "overdue", "yielded")
    )
    return value


@settings(max_examples=80, deadline=None)
@given(ops=steps)
def test_no_intent_outlives_a_sweep_and_every_refused_pod_is_retried_once(
    ops: list[tuple[str, int]],
) -> None:
    kube = MemoryKube()
    kube.put_node(gpu_node("n0", gpus_units=[16]))
    stream = [
        kube.create_pod(gpu_pod(f"p{i}", mem=15, namespace=f"ns{i % 2}")) for i in range(PODS)
    ]
    now = [START]

    async def body(rig: Rig) -> None:
        extender = rig.extender
        extender.clock_ns = lambda: now[0]
        refused_at: dict[str, int] = {}
        returned_at = -1
        handed: list[str] = []
        for step, (action, value) in enumerate(ops):
            before = _expired(rig)
            if action == "filter":
                pod: dict[str, Any] = stream[value]
                body = {"Pod": pod, "NodeNames": ["n0"]}
                answer = extender.filter(read_args(json.dumps(body).encode()))
                name = pod["metadata"]["name"]
                if answer.NodeNames:
                    refused_at.pop(name, None)
                else:
                    refused_at[name] = step
            elif action == "tick":
                now[0] += value * 10**9
            if _expired(rig) > before:
                returned_at = step  # within a filter, before its own verdict
            if action == "sweep":
                due = extender.sweep()
                if _expired(rig) > before:
                    returned_at = step
                for pod_due in due:
                    assert refused_at.get(pod_due.name, step) < returned_at
                    refused_at.pop(pod_due.name)
                    handed.append(pod_due.name)
                assert all(until > now[0] for _, until in rig.cache.state.ledger.intents())
                owed = [name for name, at in refused_at.items() if at < returned_at]
                assert not owed, f"refused before GPUs came back, never handed out: {owed}"

    run_with_rig(kube, body)


def _filter(rig: Rig, pod: dict[str, Any]) -> list[str]:
    body = {"Pod": pod, "NodeNames": ["n0"]}
    names: list[str] = rig.extender.filter(read_args(json.dumps(body).encode())).NodeNames or []
    return names


def _one_gpu(*names: str) -> tuple[MemoryKube, list[dict[str, Any]]]:
    """One 16 GiB GPU and pods of 15 GiB each: one fits at a time."""
    kube = MemoryKube()
    kube.put_node(gpu_node("n0", gpus_units=[16]))
    return kube, [kube.create_pod(gpu_pod(name, mem=15)) for name in names]


async def _bound(rig: Rig, pod: dict[str, Any], now: list[int]) -> None:
    """The extender on a clock of its own, the pod filtered and bound, the watch caught up."""
    rig.extender.clock_ns = lambda: now[0]
    await rig.settle()
    assert _filter(rig, pod) == ["n0"]
    reply = await rig.post("bind", binding(pod, "n0"))
    assert not reply.get("Error"), reply
    await rig.settle()
    assert rig.extender.sweep() == []


def test_a_pod_refused_while_the_extenders_watch_lagged_a_deletion_is_tried_again() -> None:
    # kube-scheduler saw the bound pod deleted before the extender did and filtered the waiting
    # pod again at once: the extender, still counting the deleted pod, refused it. Nothing else
    # would bring it back for 5 minutes, so the deletion the watch shows next makes it due.
    kube, (holder, waiter) = _one_gpu("holder", "waiter")
    now = [START]

    async def body(rig: Rig) -> None:
        await _bound(rig, holder, now)
        assert _filter(rig, waiter) == []  # refused: the holder is there
        now[0] += 2 * 10**9
        assert rig.extender.sweep() == []  # nothing came back yet
        kube.delete_pod("default", "holder")
        await rig.settle()
        assert [p.name for p in rig.extender.sweep()] == ["waiter"]
        assert rig.extender.sweep() == []  # once per refusal
        assert _filter(rig, waiter) == ["n0"]

    run_with_rig(kube, body)


def test_a_deletion_makes_due_only_the_pods_refused_in_the_last_lag_seconds() -> None:
    # A pod refused long before the deletion was refused before the share came back:
    # kube-scheduler tries it again on the deletion itself, and the extender does not touch it.
    kube, (holder, old, recent) = _one_gpu("holder", "old", "recent")
    now = [START]

    async def body(rig: Rig) -> None:
        await _bound(rig, holder, now)
        assert _filter(rig, old) == []
        for _ in range(int(LAG_S) + 2):  # the sweeps a running extender makes, a second apart
            now[0] += 10**9
            assert rig.extender.sweep() == []
        assert _filter(rig, recent) == []
        kube.delete_pod("default", "holder")
        await rig.settle()
        assert [p.name for p in rig.extender.sweep()] == ["recent"]

    run_with_rig(kube, body)


def test_a_pending_pods_intent_gone_with_it_makes_the_refused_pods_due() -> None:
    # A pending pod's intent holds the share until it is bound or gone; deleted while pending it
    # frees the share with no event kube-scheduler counts for the pods waiting on it.
    kube, (first, second) = _one_gpu("first", "second")

    async def body(rig: Rig) -> None:
        await rig.settle()
        assert _filter(rig, first) == ["n0"]
        assert rig.cache.state.ledger.intent_until(first["metadata"]["uid"]) is not None
        assert _filter(rig, second) == []
        assert rig.extender.sweep() == []
        kube.delete_pod("default", "first")
        await rig.settle()
        assert [p.name for p in rig.extender.sweep()] == ["second"]

    run_with_rig(kube, body)
