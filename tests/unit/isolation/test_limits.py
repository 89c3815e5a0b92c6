"""The limits file the device plugin writes and the interposer reads (a golden wire format)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gpushare.isolation.limits import ContainerLimits, mem_limit_text

GiB = 2**30
SOCK = "/var/run/gpushare/broker.sock"


def test_the_file_of_a_two_gpu_core_mem_container(golden: Callable[[str, str], None]) -> None:
    limits = ContainerLimits(
        mem_limit_bytes=(4 * GiB, 2 * GiB),
        core_pct=30,
        unit="1GiB",
        broker="/var/run/gpushare/broker.sock",
    )
    golden("limits_file.txt", limits.render())
    assert ContainerLimits.parse(limits.render()) == limits


UUID0 = "GPU-5a2f3b1c-0000-4000-8000-000000000000"
UUID1 = "GPU-5a2f3b1c-0000-4000-8000-000000000001"


def test_each_gpu_is_named_by_its_uuid_in_the_order_of_its_limits() -> None:
    limits = ContainerLimits((4 * GiB, 2 * GiB), 0, "1GiB", SOCK, uuids=(UUID1, UUID0))
    text = limits.render()
    assert text.endswith(
        f"mem_limit={4 * GiB},{2 * GiB}\ncore_limit=0\nunit=1GiB\n"
        f"broker={SOCK}\nuuids={UUID1},{UUID0}\n"
    )
    assert ContainerLimits.parse(text) == limits
    same = ContainerLimits((2 * GiB, 2 * GiB), 0, "1GiB", SOCK, uuids=(UUID0, UUID1))
    assert ContainerLimits.parse(same.render()).uuids == (UUID0, UUID1)


def test_one_value_stands_for_every_gpu_when_they_agree() -> None:
    assert mem_limit_text((2 * GiB, 2 * GiB)) == str(2 * GiB)
    assert mem_limit_text((2 * GiB, GiB)) == f"{2 * GiB},{GiB}"


@pytest.mark.parametrize(
    ("limits", "words"),
    [
        (ContainerLimits((), 0, "1GiB", SOCK), "positive byte counts"),
        (ContainerLimits((0,), 0, "1GiB", SOCK), "positive byte counts"),
        (ContainerLimits((GiB,), 101, "1GiB", SOCK), "core_pct must be 0..100"),
        (ContainerLimits((GiB,), 0, "1 GiB", SOCK), "unit='1 GiB'"),
        (ContainerLimits((GiB,), 0, "1GiB", "var/run"), "must be an absolute path"),
        (ContainerLimits((GiB,), 0, "1GiB", "/" + "s" * 107), "at most 107 bytes"),
        (ContainerLimits((GiB,), 0, "1GiB", SOCK, uuids=("GPU-fake-n-0",)), "NVML's form"),
        (ContainerLimits((GiB,), 0, "1GiB", SOCK, uuids=(UUID0, UUID0)), "distinct"),
        (ContainerLimits((GiB, 2 * GiB, GiB), 0, "1GiB", SOCK, uuids=(UUID0, UUID1)), "3 limits"),
    ],
)
def test_what_the_interposer_would_refuse_is_never_written(
    limits: ContainerLimits, words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        limits.render()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("version=1\nmem_limit=1\ncore_limit=0\nunit=1GiB\naccounting_dir=/a\n", "version='1'"),
        ("version=2\nmem_limit=1\ncore_limit=0\nunit=1GiB\n", "'broker'"),
        ("version=2\nversion=2\n", "given once"),
        ("version=2\nmem_limit=x\ncore_limit=0\nunit=1GiB\nbroker=/b\n", "invalid literal"),
        ("version=2\nmem_limit=1\ncore_limit=0\nunit=1GiB\nbroker=b\n", "absolute path"),
    ],
)
def test_a_file_the_plugin_did_not_write_this_way_is_not_read_back(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        ContainerLimits.parse(text)
