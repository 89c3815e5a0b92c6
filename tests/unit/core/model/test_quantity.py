"""Quantities: every spelling Kubernetes reads as one number reads as that number here."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.core.model.quantity import MAX_LENGTH, Quantity, parse_quantity


@st.composite
def spellings(draw: st.DrawFn) -> tuple[str, int]:
    """A whole number and one of the ways a user or the API server may write it."""
    n = draw(st.integers(0, 10**12))
    sign = draw(st.sampled_from(["", "+"]))
    zeros = "0" * draw(st.integers(0, 3))
    form = draw(st.sampled_from(["plain", "point", "exponent", "milli", "micro", "nano"]))
    if form == "plain":
        text = f"{zeros}{n}"
    elif form == "point":
        text = f"{zeros}{n}." + "0" * draw(st.integers(0, 4))
    elif form == "exponent":
        shift = draw(st.integers(0, 5))  # n * 10^shift written with e-shift
        letter = draw(st.sampled_from("eE"))
        text = f"{n * 10**shift}{letter}-{shift}" if shift else f"{n}{letter}0"
    else:
        scale = {"milli": ("m", 3), "micro": ("u", 6), "nano": ("n", 9)}[form]
        text = f"{n * 10 ** scale[1]}{scale[0]}"
    return sign + text, n


@settings(max_examples=300, deadline=None)
@given(spellings())
def test_every_spelling_of_a_whole_number_reads_as_it(spelled: tuple[str, int]) -> None:
    text, n = spelled
    parsed = parse_quantity(text)
    assert isinstance(parsed, Quantity) and parsed.value == n and not parsed.multiplied


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789+-.eEKikMGTPnum x", max_size=12))
def test_any_text_is_a_quantity_or_a_reason_never_an_error(text: str) -> None:
    assert isinstance(parse_quantity(text), Quantity | str)


@pytest.mark.parametrize(
    ("text", "value", "suffix"),
    [
        ("1k", 1000, "k"),
        ("3Gi", 3 * 2**30, "Gi"),
        ("1.5Gi", 3 * 2**29, "Gi"),
        ("1E", 10**18, "E"),
        ("1E2", 100, ""),
        ("1e+2", 100, ""),
        ("-2", -2, ""),
        ("1.5", Fraction(3, 2), ""),
        ("0.9n", Fraction(9, 10**10), "n"),
        ("+", 0, ""),  # ParseQuantity reads missing digits as zero
        (".", 0, ""),
        ("1e99999999", 10**60, ""),  # capped: far above every ceiling all the same
    ],
)
def test_values_and_suffixes(text: str, value: Fraction | int, suffix: str) -> None:
    parsed = parse_quantity(text)
    assert isinstance(parsed, Quantity) and (parsed.value, parsed.suffix) == (value, suffix)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("", "is not a quantity"),
        ("3 Gi", "is not a quantity"),
        ("3K", "is not a quantity"),
        ("0x10", "is not a quantity"),
        ("1e", "is not a quantity"),
        ("Gi3", "is not a quantity"),
        ("1" * (MAX_LENGTH + 1), f"is longer than {MAX_LENGTH} characters"),
        (None, "is not a number"),
        (True, "is not a number"),
        (float("nan"), "is not a number"),
        ([3], "is not a number"),
    ],
)
def test_what_is_not_a_quantity(raw: object, reason: str) -> None:
    assert parse_quantity(raw) == reason


@settings(max_examples=300)
@given(st.from_regex(r"[+-]?[0-9]{0,4}(\.[0-9]{0,3})?(Ki|Mi|Gi|m|k|M|G|e[0-9])?", fullmatch=True))
def test_a_kept_reading_is_the_reading(text: str) -> None:
    """Readings of strings are kept; every one equals a fresh reading, twice over."""
    from gpushare.core.model import quantity

    fresh = quantity._parse_text.__wrapped__(text)
    assert parse_quantity(text) == fresh
    assert parse_quantity(text) == fresh
    assert parse_quantity(f" {text} ") == fresh


def test_kept_amounts_depend_on_the_scale_they_were_read_at() -> None:
    """A CPU and a memory amount written alike are kept apart: milli-CPU and bytes."""
    from gpushare.core.model.hostresources import HostResources, pod_requests

    for text, cpu, memory in (("1", 1000, 1), ("100m", 100, 1), ("2k", 2_000_000, 2000)):
        pod = {"spec": {"containers": [{"resources": {"requests": {"cpu": text}}}]}}
        assert pod_requests(pod).cpu_milli == cpu
        both = {"spec": {"containers": [{"resources": {"requests": {"memory": text}}}]}}
        assert pod_requests(both) == HostResources(0, memory)
