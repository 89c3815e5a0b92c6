"""cGPU policies: the number's validation and the time slices each policy gives."""

from __future__ import annotations

import pytest

from gpushare.isolation.limits import ContainerLimits
from gpushare.isolation.policy import (
    OPEN,
    Member,
    Policy,
    PolicyError,
    WeightReading,
    own_share_pct,
    parse_max_pods,
    parse_policy,
    parse_weight,
    schedule,
    slot_id,
    weight_from_env,
)

PERIOD = 100_000_000


@pytest.mark.parametrize("value", [0, "0", "5", " 3 "])
def test_policy_numbers_0_to_5_are_read(value: object) -> None:
    assert parse_policy(value) == Policy(int(str(value)))


@pytest.mark.parametrize("value", [-1, 6, "6", "native", "", "1.5", True, None])
def test_other_policy_values_are_refused_naming_field_value_and_rule(value: object) -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy(value, "isolation.policy")
    assert f"isolation.policy={value!r} is not a cGPU policy" in str(err.value)
    assert "5 (native, the default)" in str(err.value)


@pytest.mark.parametrize("value", ["0", "101", "x", "-2"])
def test_weights_outside_1_to_100_are_refused(value: str) -> None:
    with pytest.raises(PolicyError, match=rf"ALIYUN_COM_GPU_SCHD_WEIGHT='{value}'.*1 to 100"):
        parse_weight(value)


def three(active: tuple[bool, ...] = (True, True, True)) -> list[Member]:
    return [
        Member("a", 10, weight=1, active=active[0]),
        Member("b", 20, weight=2, active=active[1]),
        Member("c", 40, weight=3, active=active[2]),
    ]


def owned(policy: Policy, members: list[Member], max_pods: int = 20) -> dict[str, float]:
    plan = schedule(policy, members, max_pods=max_pods, epoch_ns=7, period_ns=PERIOD)
    return {s.owner: round(plan.share_of(s.owner), 4) for s in plan.slots}


def test_each_policy_shares_the_period_as_ack_documents() -> None:
    assert owned(Policy.EVEN, three()) == {"a": 0.05, "b": 0.05, "c": 0.05}
    assert owned(Policy.FIXED, three()) == {"a": 0.1, "b": 0.2, "c": 0.4}
    assert owned(Policy.PREEMPTIVE, three()) == {"a": 0.3333, "b": 0.3333, "c": 0.3333}
    assert owned(Policy.WEIGHTED, three()) == {"a": 0.1667, "b": 0.3333, "c": 0.5}
    assert owned(Policy.SOFT, three()) == {"a": 0.05, "b": 0.05, "c": 0.05, OPEN: 0.85}
    assert owned(Policy.NATIVE, three()) == {}


def test_only_active_members_share_under_preemptive_weighted_and_soft() -> None:
    idle_b = three((True, False, True))
    assert owned(Policy.PREEMPTIVE, idle_b) == {"a": 0.5, "c": 0.5}
    assert owned(Policy.WEIGHTED, idle_b) == {"a": 0.25, "c": 0.75}
    assert owned(Policy.SOFT, idle_b) == {"a": 0.05, "c": 0.05, OPEN: 0.9}
    assert owned(Policy.EVEN, idle_b) == {"a": 0.05, "b": 0.05, "c": 0.05}


def test_slots_do_not_overlap_and_fixed_shares_over_the_gpu_are_scaled_down() -> None:
    over = [Member("a", 80), Member("b", 60)]
    plan = schedule(Policy.FIXED, over, max_pods=20, epoch_ns=0, period_ns=PERIOD)
    ends = [(s.start_ns, s.start_ns + s.length_ns) for s in plan.slots]
    assert ends[0][1] <= ends[1][0] and ends[1][1] <= PERIOD
    assert round(plan.share_of("a"), 3) == round(80 / 140, 3)


def test_the_schedule_file_names_every_slot() -> None:
    text = schedule(Policy.SOFT, three(), max_pods=20, epoch_ns=42, period_ns=PERIOD).render()
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines == [
        "version=1",
        "policy=4",
        f"period_ns={PERIOD}",
        "epoch_ns=42",
        "slot=a,0,5000000",
        "slot=b,5000000,5000000",
        "slot=c,10000000,5000000",
        "slot=*,15000000,85000000",
        "member=a,1,1",
        "member=b,2,1",
        "member=c,3,1",
    ]


def test_slot_ids_are_short_stable_and_differ_per_key() -> None:
    assert slot_id("uid/main") == slot_id("uid/main")
    assert slot_id("uid/main") != slot_id("uid/side")
    assert len(slot_id("uid/main")) == 16 and slot_id("uid/main").isalnum()


def test_a_scheduled_limits_file_reads_back_as_written() -> None:
    limits = ContainerLimits(
        (2**30,), 30, "1GiB", "/b.sock", policy=3, weight=2, slot="ab12", sched_dir="/s", gpus=(3,)
    )
    text = limits.render()
    assert "version=3\n" in text and "policy=3\ngpus" not in text
    assert ContainerLimits.parse(text) == limits


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"policy": 5}, "policy must be 0..4"),
        ({"weight": 0}, "weight must be 1..100"),
        ({"slot": "a-b"}, "slot must be"),
        ({"gpus": ()}, "gpus must be"),
    ],
)
def test_a_scheduled_limits_file_refuses_bad_settings(change: dict, message: str) -> None:  # type: ignore[type-arg]
    base = {"policy": 0, "weight": 1, "slot": "ab", "sched_dir": "/s", "gpus": (0,)}
    with pytest.raises(ValueError, match=message):
        ContainerLimits((2**30,), 0, "1GiB", "/b.sock", **{**base, **change}).render()


def env(*entries: dict[str, object]) -> list[dict[str, object]]:
    return list(entries)


def test_a_weight_is_read_from_the_container_spec_and_defaults_to_1() -> None:
    name = "ALIYUN_COM_GPU_SCHD_WEIGHT"
    where = "pod ns/p container c"
    assert weight_from_env(None, max_weight=20, where=where) == WeightReading(1)
    assert weight_from_env(env({"name": "X", "value": "7"}), max_weight=20, where=where).weight == 1
    assert weight_from_env(env({"name": name, "value": "7"}), max_weight=20, where=where) == (
        WeightReading(7)
    )
    later = env({"name": name, "value": "2"}, {"name": name, "value": "5"})
    assert weight_from_env(later, max_weight=20, where=where).weight == 5


@pytest.mark.parametrize("value", ["0", "21", "x", "", "2.5", None])
def test_a_bad_weight_falls_back_to_1_naming_field_value_and_rule(value: object) -> None:
    reading = weight_from_env(
        [{"name": "ALIYUN_COM_GPU_SCHD_WEIGHT", "value": value}],
        max_weight=20,
        where="pod ns/p container c",
    )
    assert reading.weight == 1
    assert f"pod ns/p container c env ALIYUN_COM_GPU_SCHD_WEIGHT={value!r}" in reading.problem
    assert "from 1 to 20" in reading.problem and reading.problem.endswith("weight 1 is used")


def test_a_weight_through_value_from_is_not_read() -> None:
    entry = {"name": "ALIYUN_COM_GPU_SCHD_WEIGHT", "valueFrom": {"configMapKeyRef": {}}}
    reading = weight_from_env([entry], max_weight=16, where="pod ns/p container c")
    assert reading.weight == 1 and "valueFrom" in reading.problem


@pytest.mark.parametrize(("value", "expected"), [("1", 1), (64, 64), (" 16 ", 16)])
def test_max_pods_per_gpu_1_to_64_is_read(value: object, expected: int) -> None:
    assert parse_max_pods(value) == expected


@pytest.mark.parametrize("value", ["0", "65", "x", True])
def test_other_max_pods_are_refused(value: object) -> None:
    with pytest.raises(PolicyError, match="is not a pod count per GPU: use a whole number from 1"):
        parse_max_pods(value)


@pytest.mark.parametrize(
    ("policy", "weight", "fixed", "expected"),
    [
        (Policy.EVEN, 1, 0, 5),
        (Policy.PREEMPTIVE, 1, 0, 5),
        (Policy.SOFT, 1, 0, 5),
        (Policy.WEIGHTED, 3, 0, 15),
        (Policy.WEIGHTED, 20, 0, 100),
        (Policy.FIXED, 1, 35, 35),
        (Policy.FIXED, 1, 0, 1),
    ],
)
def test_own_share_is_what_the_policy_gives_on_a_full_gpu(
    policy: Policy, weight: int, fixed: int, expected: int
) -> None:
    """The share the interposer keeps to without a schedule: never the whole GPU by default."""
    assert own_share_pct(policy, max_pods=20, weight=weight, fixed_pct=fixed) == expected


def test_own_share_rounds_down_and_is_never_zero() -> None:
    assert own_share_pct(Policy.EVEN, max_pods=64) == 1
    assert own_share_pct(Policy.EVEN, max_pods=16) == 6
    with pytest.raises(PolicyError, match="max_pods=0"):
        own_share_pct(Policy.EVEN, max_pods=0)
