"""The GPU memory unit: every ``aliyun.com/gpu-mem`` count is a number of these.

The unit is a cluster-wide setting (``gpuMemoryUnit``) that the device plugin also writes on
each node, so the scheduler never guesses it from the size of numbers, as the predecessor did.
"""

from __future__ import annotations

from enum import Enum

MAX_GPU_MEMORY_MIB = 1 << 30
"""The most memory gpushare believes one GPU can have: 1 PiB (2^20 GiB).

The largest GPUs carry a few hundred GiB and announced ones about 1 TiB, so this leaves a
thousandfold headroom; yet any GPU's size in bytes (2^30 and up) is above it in either unit
(2^20 units of 1 GiB, 2^23 of 128 MiB). A count above it is a size in bytes, or a typo, and is
refused where it is read, instead of making a node look endless or a pod wait forever.
"""
MAX_GPU_MEMORY = "1 PiB"


class MemoryUnit(Enum):
    """One ``aliyun.com/gpu-mem`` device: 1 GiB (default) or 128 MiB."""

    GiB = "1GiB"
    MiB128 = "128MiB"

    @property
    def mib(self) -> int:
        """Size of one unit in MiB."""
        return 1024 if self is MemoryUnit.GiB else 128

    @property
    def max_units(self) -> int:
        """``MAX_GPU_MEMORY_MIB`` in this unit: the most units one GPU can have."""
        return MAX_GPU_MEMORY_MIB // self.mib

    @property
    def default_max_pods_per_gpu(self) -> int:
        """Isolation's pod limit per GPU at this unit (seed: 20, or 16 at 128 MiB)."""
        return 20 if self is MemoryUnit.GiB else 16

    def describe(self, units: int) -> str:
        """Render an amount for people: ``3 GiB`` or ``24x128MiB (3 GiB)``."""
        if self is MemoryUnit.GiB:
            return f"{units} GiB"
        gib = units * self.mib / 1024
        return f"{units}x128MiB ({gib:g} GiB)"

    def describe_ratio(self, free: int, total: int) -> str:
        """Render ``free/total`` with the unit: ``2/15 GiB`` or ``16/120 x128MiB``."""
        if self is MemoryUnit.GiB:
            return f"{free}/{total} GiB"
        return f"{free}/{total} x128MiB"

    @classmethod
    def parse(cls, text: str) -> MemoryUnit:
        """Read a unit as written in values, flags and node annotations."""
        normalized = text.strip().replace(" ", "")
        aliases = {"1GiB": cls.GiB, "GiB": cls.GiB, "128MiB": cls.MiB128}
        try:
            return aliases[normalized]
        except KeyError:
            raise ValueError(
                f"gpuMemoryUnit={text!r} is not supported: use 1GiB (default) or 128MiB"
            ) from None
