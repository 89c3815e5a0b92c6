"""Pod requests: valid shapes, Kubernetes' init-container counting, every invalid input."""

from __future__ import annotations

from typing import Any

import pytest

from gpushare.core.model.containers import ContainerKind
from gpushare.core.model.requests import PodRequest, Rejection, read_pod
from gpushare.core.model.units import MemoryUnit

MEM = "aliyun.com/gpu-mem"
CORE = "aliyun.com/gpu-core.percentage"


def pod(
    *containers: dict[str, Any],
    init: tuple[dict[str, Any], ...] = (),
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": labels or {}},
        "spec": {"containers": list(containers), "initContainers": list(init)},
    }


def c(
    name: str = "main",
    limits: dict[str, Any] | None = None,
    requests: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    return {"name": name, "resources": resources, **extra}


def ok(p: dict[str, Any], unit: MemoryUnit = MemoryUnit.GiB) -> PodRequest:
    result = read_pod(p, unit=unit)
    assert isinstance(result, PodRequest), getattr(result, "message", result)
    return result


def rejected(p: dict[str, Any], unit: MemoryUnit = MemoryUnit.GiB) -> str:
    result = read_pod(p, unit=unit)
    assert isinstance(result, Rejection), result
    return result.message


def test_seed_request_reads_three_units() -> None:
    request = ok(pod(c("gpu-share-sample", {MEM: 3})))
    assert (request.mem_units, request.core_pct, request.gpu_count) == (3, 0, 1)
    assert request.wants_gpu and not request.wants_core


def test_string_quantities_and_equal_requests_are_accepted() -> None:
    request = ok(pod(c(limits={MEM: "2", CORE: "30"}, requests={MEM: "2", CORE: 30})))
    assert (request.mem_units, request.core_pct) == (2, 30)


def test_pod_without_gpu_resources_wants_nothing() -> None:
    request = ok(pod(c(limits={"cpu": "1"})))
    assert not request.wants_gpu


def test_app_containers_add_up() -> None:
    assert ok(pod(c("a", {MEM: 2}), c("b", {MEM: 3}))).mem_units == 5


def test_init_container_counts_as_its_own_maximum() -> None:
    request = ok(pod(c("a", {MEM: 2}), init=(c("i", {MEM: 6}),)))
    assert request.mem_units == 6
    assert [x.kind for x in request.containers] == [ContainerKind.INIT, ContainerKind.APP]


def test_sidecar_adds_to_everything_after_it() -> None:
    sidecar = c("s", {MEM: 1}, restartPolicy="Always")
    request = ok(pod(c("a", {MEM: 2}), init=(sidecar, c("i", {MEM: 4}))))
    # init "i" runs beside the sidecar: 1 + 4 = 5 > app 2 + sidecar 1
    assert request.mem_units == 5


def test_multi_gpu_splits_evenly() -> None:
    request = ok(pod(c(limits={MEM: 8, CORE: 60}), labels={"aliyun.com/gpu-count": "2"}))
    assert (request.gpu_count, request.mem_per_gpu, request.core_per_gpu) == (2, 4, 30)


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        (0, "asks for nothing"),
        ("0", "asks for nothing"),
        (-1, "is negative"),
        ("-2", "is negative"),
        (1.5, "is fractional"),
        ("1.5", "is fractional"),
        ("3Gi", "counts units of 1GiB, not bytes"),
        ("1.5Gi", "counts units of 1GiB, not bytes"),
        ("3G", "more than any GPU has"),
        ("3500m", "is fractional"),
        ("2.5e0", "is fractional"),
        ("three", "is not a whole number"),
        ("3 Gi", "is not a whole number"),
        ("0x10", "is not a whole number"),
        ("", "is not a whole number"),
        ("1" * 65, "longer than"),
        ("3221225472", "counts units of 1GiB, not bytes"),
        ("1e30", "more than any GPU has"),
        (True, "is not a number"),
        (None, "is not a number"),
    ],
)
def test_bad_gpu_mem_names_container_field_value_and_rule(value: Any, needle: str) -> None:
    message = rejected(pod(c("trainer", {MEM: value})))
    assert 'container "trainer" (spec.containers[0])' in message
    assert f'limits["{MEM}"]={value!r}' in message
    assert needle in message
    assert "write" in message  # says what to do


@pytest.mark.parametrize(
    "spelling",
    [
        3,
        3.0,
        "3",
        "+3",
        "03",
        " 3 ",
        "3.",
        "3.000",
        "3e0",
        "3E0",
        "0.3e1",
        "30e-1",
        "3000m",
        "3000000u",
        "3000000000n",
        "+0.003e3",
    ],
)
def test_every_spelling_kubernetes_counts_as_three_reads_three(spelling: Any) -> None:
    request = ok(pod(c(limits={MEM: spelling})))
    assert request.mem_units == 3


@pytest.mark.parametrize("spelling", ["1k", "1000", 1000, "1e3", "+1k", "1.000k", "0.001M"])
def test_a_multiple_of_1000_reads_as_kube_apiserver_stores_it(spelling: Any) -> None:
    """kube-apiserver stores ``1000`` as ``"1k"`` (Quantity's canonical form): at 128 MiB units
    that is 125 GiB, a real request, and it must read as 1000 however it is spelled."""
    assert ok(pod(c(limits={MEM: spelling})), unit=MemoryUnit.MiB128).mem_units == 1000


def test_core_spellings_kubernetes_counts_alike_are_accepted() -> None:
    assert ok(pod(c(limits={MEM: 1, CORE: "+30"}))).core_pct == 30
    assert ok(pod(c(limits={MEM: 1, CORE: "3e1"}))).core_pct == 30


def test_core_in_bytes_notation_says_it_counts_percent() -> None:
    message = rejected(pod(c(limits={MEM: 1, CORE: "1Ki"})))
    assert "counts percent of one GPU, not bytes" in message


def test_the_memory_ceiling_follows_the_unit() -> None:
    most = 1 << 20  # 1 PiB of 1 GiB units
    assert ok(pod(c(limits={MEM: most}))).mem_units == most
    assert "more than any GPU has" in rejected(pod(c(limits={MEM: most + 1})))
    at_128 = read_pod(pod(c(limits={MEM: most * 8})), unit=MemoryUnit.MiB128)
    assert isinstance(at_128, PodRequest)
    message = rejected(pod(c(limits={MEM: "2Gi"})), unit=MemoryUnit.MiB128)
    assert "counts units of 128MiB, not bytes: for 3 GiB write 24" in message


def test_requests_equal_to_limits_in_another_spelling_are_accepted() -> None:
    assert ok(pod(c(limits={MEM: "+3"}, requests={MEM: "3"}))).mem_units == 3


def test_requests_differing_from_limits_are_rejected() -> None:
    message = rejected(pod(c(limits={MEM: 3}, requests={MEM: 2})))
    assert f'requests["{MEM}"]=2 differs from limits["{MEM}"]=3' in message
    assert "set only limits" in message


def test_request_without_limit_is_rejected() -> None:
    message = rejected(pod(c(requests={MEM: 2})))
    assert f'requests["{MEM}"]=2 is set without limits["{MEM}"]' in message


@pytest.mark.parametrize("core", [33, "12", 7])
def test_core_not_multiple_of_five_is_refused_in_words_for_any_kind(core: Any) -> None:
    message = rejected(pod(c(limits={MEM: 2, CORE: core})))
    assert f'limits["{CORE}"]={core!r} is not a multiple of 5' in message
    assert "computing power is shared in steps of 5: use 5, 10, ... 100" in message
    assert "job" not in message.lower()  # a Pod or a Deployment is no job


def test_core_zero_is_rejected() -> None:
    assert "asks for nothing" in rejected(pod(c(limits={MEM: 2, CORE: 0})))


@pytest.mark.parametrize(("core", "labels"), [(105, None), (250, {"aliyun.com/gpu-count": "2"})])
def test_core_above_100_per_gpu_is_rejected(core: int, labels: dict[str, str] | None) -> None:
    message = rejected(pod(c(limits={MEM: 2, CORE: core}), labels=labels))
    assert "per GPU" in message and "from 5 to 100" in message


def test_core_too_large_for_a_float_is_rejected_in_words() -> None:
    core = 3 * 10**400  # a whole number as JSON may spell it; no float holds its share
    message = rejected(pod(c(limits={MEM: 2, CORE: core})))
    assert "3.00000e+400% per GPU" in message and "from 5 to 100" in message


def test_core_below_five_per_gpu_over_several_gpus_is_rejected() -> None:
    message = rejected(pod(c(limits={MEM: 4, CORE: 5}), labels={"aliyun.com/gpu-count": "2"}))
    assert "2.5% per GPU" in message


def test_core_without_memory_is_rejected() -> None:
    message = rejected(pod(c("infer", {CORE: 30})))
    assert 'container "infer"' in message
    assert f'limits["{CORE}"]=30 is set without limits["{MEM}"]' in message
    assert f"add {MEM}" in message


@pytest.mark.parametrize("label", ["0", "-1", "two", "1.5", ""])
def test_bad_gpu_count_label_is_rejected(label: str) -> None:
    message = rejected(pod(c(limits={MEM: 4}), labels={"aliyun.com/gpu-count": label}))
    assert f"pod label aliyun.com/gpu-count={label!r} must be a whole number >= 1" in message


def test_memory_not_dividing_by_gpu_count_is_rejected() -> None:
    message = rejected(pod(c(limits={MEM: 5}), labels={"aliyun.com/gpu-count": "2"}))
    assert "pod memory 5 GiB does not divide evenly over label aliyun.com/gpu-count=2" in message


def test_gpu_count_label_without_memory_is_rejected() -> None:
    message = rejected(pod(c(limits={"cpu": 1}), labels={"aliyun.com/gpu-count": "2"}))
    assert "no container asks for aliyun.com/gpu-mem" in message


def test_init_container_errors_name_the_init_container() -> None:
    message = rejected(pod(c(limits={MEM: 1}), init=(c("setup", {MEM: "2Gi"}),)))
    assert 'container "setup" (spec.initContainers[0])' in message


def test_every_problem_is_reported_at_once() -> None:
    result = read_pod(pod(c("a", {MEM: "3Gi"}), c("b", {CORE: 7})))
    assert isinstance(result, Rejection)
    assert len(result.reasons) == 3


def test_unit_appears_in_messages_at_128mib() -> None:
    message = rejected(pod(c(limits={MEM: "1.5"})), unit=MemoryUnit.MiB128)
    assert "counts whole units of 128MiB" in message
