"""Kubernetes quantities, read with the API server's grammar and exact values.

``resource.Quantity`` (k8s.io/apimachinery/pkg/api/resource/quantity.go, ``ParseQuantity``)
reads::

    <quantity> ::= <sign>? <number> <suffix>          (surrounding spaces trimmed in JSON)
    <sign>     ::= "+" | "-"
    <number>   ::= <digits> | <digits>. | <digits>.<digits> | .<digits>
    <suffix>   ::= "" | n | u | m | k | M | G | T | P | E        decimal SI
                 | Ki | Mi | Gi | Ti | Pi | Ei                   binary SI (powers of 1024)
                 | (e | E) <sign>? <digits>                      decimal exponent

It keeps the string as written when it is already short, so ``"+3"`` and ``"3e0"`` come back
from the API server as the user wrote them, while kubelet writes 1000 devices as ``"1k"`` (the
canonical form). Every spelling of the same number must therefore read alike here: the value is
an exact fraction, never a float. Like ``ParseQuantity``, digits may be missing (``"+"``, ``"."``
and ``"k"`` are zero); unlike it, a string longer than ``MAX_LENGTH`` is refused, because a count
that long is a mistake and its digits would cost more to convert than to refuse.

What a resource accepts is decided by its reader (``core.model.requests``,
``core.model.inventory``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

MAX_LENGTH = 64
"""Characters; "1048576" is seven, and Kubernetes itself writes at most a few dozen."""

DECIMAL_SI = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
"""Suffix to power of ten."""
BINARY_SI = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
"""Suffix to power of two."""

_EXPONENT_CAP = 60
"""Powers of ten beyond this change nothing a reader decides (every ceiling is far below 1e60,
every fraction of 1e-60 is still a fraction), and keep the exact value cheap to build."""

_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<whole>[0-9]*)(?:\.(?P<fraction>[0-9]*))?"
    r"(?:(?P<si>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE](?P<exponent>[+-]?[0-9]+))?"
)


@dataclass(frozen=True)
class Quantity:
    """A parsed quantity: its exact value and the suffix it was written with."""

    value: Fraction
    suffix: str = ""
    """``Gi``, ``k``, ``m``, ... as written; empty for none or a decimal exponent."""

    @property
    def binary(self) -> bool:
        """Written with a power-of-1024 suffix, the notation of byte sizes."""
        return self.suffix in BINARY_SI

    @property
    def multiplied(self) -> bool:
        """Written with a suffix that multiplies (k and above, Ki and above)."""
        return self.binary or DECIMAL_SI.get(self.suffix, 0) > 0

    @property
    def factor(self) -> str:
        """What the suffix multiplies by, for messages: ``x1000`` or ``x2^30``."""
        if self.binary:
            return f"x2^{BINARY_SI[self.suffix]}"
        return f"x{10 ** DECIMAL_SI.get(self.suffix, 0)}"


PARSED_KEPT = 4096
"""Distinct quantity strings whose reading is kept (``parse_quantity``)."""


def parse_quantity(raw: Any) -> Quantity | str:
    """The quantity in a JSON value (string or number), or why it is not one.

    A string's reading is kept (``PARSED_KEPT`` of them, least recently used dropped): a
    cluster writes few distinct quantities (``100m``, ``4``, ``16Gi``), each read for every
    container of every pod the watch shows and kube-scheduler asks about, and the reading, a
    regular expression and exact fractions, cost more than all the rest of reading a pod.
    Both answers are immutable, so sharing one is safe.
    """
    if isinstance(raw, str):
        return _parse_text(raw)
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return "is not a number"
    if isinstance(raw, int):
        return Quantity(Fraction(raw))
    if raw != raw or raw in (float("inf"), float("-inf")):
        return "is not a number"
    return Quantity(Fraction(raw))


@lru_cache(maxsize=PARSED_KEPT)
def _parse_text(raw: str) -> Quantity | str:
    """``parse_quantity`` of a string."""
    text = raw.strip()
    if len(text) > MAX_LENGTH:
        return f"is longer than {MAX_LENGTH} characters"
    match = _QUANTITY.fullmatch(text)
    if not text or match is None:
        return "is not a quantity"
    whole = match["whole"].lstrip("0")
    fraction = (match["fraction"] or "").rstrip("0")
    digits = int(whole + fraction or "0")
    suffix = match["si"] or ""
    if match["exponent"] is not None:
        power = int(match["exponent"]) - len(fraction)
    else:
        power = DECIMAL_SI.get(suffix, 0) - len(fraction)
    power = max(-_EXPONENT_CAP, min(_EXPONENT_CAP, power))
    value = digits * Fraction(10) ** power * (2 ** BINARY_SI.get(suffix, 0))
    return Quantity(-value if match["sign"] == "-" else value, suffix)
