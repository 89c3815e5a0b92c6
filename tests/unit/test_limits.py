"""The limits file the device plugin writes and the interposer reads (a golden wire format)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gpushare.isolation.limits import ContainerLimits, mem_limit_text

GiB = 2**30


def test_the_file_of_a_two_gpu_core_mem_container(golden: Callable[[str, str], None]) -> None:
    limits = ContainerLimits(
        mem_limit_bytes=(4 * GiB, 2 * GiB),
        core_pct=30,
        unit="1GiB",
        accounting_dir="/var/run/gpushare",
    )
    golden("limits_file.txt", limits.render())


def test_one_value_stands_for_every_gpu_when_they_agree() -> None:
    assert mem_limit_text((2 * GiB, 2 * GiB)) == str(2 * GiB)
    assert mem_limit_text((2 * GiB, GiB)) == f"{2 * GiB},{GiB}"


@pytest.mark.parametrize(
    ("limits", "words"),
    [
        (ContainerLimits((), 0, "1GiB", "/var/run/gpushare"), "positive byte counts"),
        (ContainerLimits((0,), 0, "1GiB", "/var/run/gpushare"), "positive byte counts"),
        (ContainerLimits((GiB,), 101, "1GiB", "/var/run/gpushare"), "core_pct must be 0..100"),
        (ContainerLimits((GiB,), 0, "1 GiB", "/var/run/gpushare"), "unit='1 GiB'"),
        (ContainerLimits((GiB,), 0, "1GiB", "var/run"), "must be absolute"),
    ],
)
def test_what_the_interposer_would_refuse_is_never_written(
    limits: ContainerLimits, words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        limits.render()
