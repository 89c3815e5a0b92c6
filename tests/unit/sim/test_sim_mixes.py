"""Multi-GPU-heavy mixes: the share asked for, by seed, the rest of the trace kept."""

from __future__ import annotations

import pytest

from gpushare.sim.mixes import is_multigpu, multigpu_mix, multigpu_share
from gpushare.sim.openb import TracePod

TRACE = [
    *(TracePod(f"s{i}", 4000, 1, 1, 500) for i in range(40)),
    *(TracePod(f"w{i}", 8000, 1, 1, 1000) for i in range(20)),
    TracePod("two", 16000, 1, 2, 1000),
    TracePod("eight", 64000, 1, 8, 1000),
    TracePod("frac2", 4000, 1, 2, 500),  # two shared GPUs: not a whole-GPU multi-GPU pod
]


@pytest.mark.parametrize("share", [0.2, 0.3, 0.4, 0.5])
def test_multigpu_pods_carry_the_share_asked_for(share: float) -> None:
    mix = multigpu_mix(TRACE, share, seed=3)
    assert share <= multigpu_share(mix)
    without_last = mix[:-1]  # the last draw is the one that reached the share
    assert multigpu_share(without_last) < share
    assert [p for p in mix if not is_multigpu(p)] == [p for p in TRACE if not is_multigpu(p)]


def test_the_same_seed_gives_the_same_mix_and_another_seed_another() -> None:
    first = multigpu_mix(TRACE, 0.5, seed=1)
    assert first == multigpu_mix(TRACE, 0.5, seed=1)
    assert first != multigpu_mix(TRACE, 0.5, seed=2)
    assert len({p.name for p in first}) == len(first)


def test_a_share_outside_0_and_1_is_refused_with_the_rule() -> None:
    with pytest.raises(ValueError, match=r"share=50 must lie strictly between 0 and 1"):
        multigpu_mix(TRACE, 50, seed=0)


def test_a_trace_without_multigpu_pods_is_refused() -> None:
    with pytest.raises(ValueError, match="no pod with 2 or more whole GPUs"):
        multigpu_mix(TRACE[:60], 0.3, seed=0)
