"""The refused GPU pods tried again when GPUs come back (core.booking.waiting)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare.core.booking.waiting import Waiting, WaitingPod


def pod(uid: str) -> WaitingPod:
    return WaitingPod(uid, "ns", f"pod-{uid}")


def test_only_the_pods_refused_before_the_mark_are_taken_oldest_first() -> None:
    waiting = Waiting()
    for uid in ("a", "b", "c"):
        waiting.refused(pod(uid))
    mark = waiting.mark()
    waiting.refused(pod("d"))
    waiting.refused(pod("a"))  # refused again: now the newest, after the mark
    assert [p.uid for p in waiting.take(10, before=mark)] == ["b", "c"]
    assert [p.uid for p in waiting.take(10, before=waiting.mark())] == ["d", "a"]
    assert len(waiting) == 0


def test_a_take_is_capped_and_the_rest_stay_due() -> None:
    waiting = Waiting()
    for uid in "abcde":
        waiting.refused(pod(uid))
    mark = waiting.mark()
    assert [p.uid for p in waiting.take(2, before=mark)] == ["a", "b"]
    assert [p.uid for p in waiting.take(2, before=mark)] == ["c", "d"]
    assert [p.uid for p in waiting.take(2, before=mark)] == ["e"]


def test_a_pod_that_fits_again_is_forgotten_and_the_oldest_drop_out_past_the_limit() -> None:
    waiting = Waiting(limit=2)
    for uid in "abc":
        waiting.refused(pod(uid))
    waiting.forget("c")
    assert "a" not in waiting and "b" in waiting and len(waiting) == 1
    with pytest.raises(ValueError, match="limit=0"):
        Waiting(limit=0)


@given(
    st.lists(st.tuples(st.sampled_from(["refuse", "forget", "mark", "take"]), st.integers(0, 5)))
)
def test_every_pod_is_taken_at_most_once_per_refusal(ops: list[tuple[str, int]]) -> None:
    waiting = Waiting(limit=4)
    refusals: dict[str, int] = {}
    takes: dict[str, int] = {}
    mark = 0
    for op, n in ops:
        uid = str(n)
        if op == "refuse":
            waiting.refused(pod(uid))
            refusals[uid] = refusals.get(uid, 0) + 1
        elif op == "forget":
            waiting.forget(uid)
        elif op == "mark":
            mark = waiting.mark()
        else:
            taken = waiting.take(n, before=mark)
            assert len(taken) <= n
            for p in taken:
                takes[p.uid] = takes.get(p.uid, 0) + 1
        assert len(waiting) <= 4
    assert all(takes[uid] <= refusals[uid] for uid in takes)


def test_a_take_after_a_mark_leaves_the_pods_refused_before_it() -> None:
    waiting = Waiting()
    waiting.refused(pod("a"))
    after = waiting.mark()
    waiting.refused(pod("b"))
    waiting.refused(pod("c"))
    before = waiting.mark()
    assert [p.uid for p in waiting.take(10, before=before, after=after)] == ["b", "c"]
    assert [p.uid for p in waiting.take(10, before=before)] == ["a"]
