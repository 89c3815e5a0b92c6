"""GPU cards' memory: how many MiB a model has, and how a model name is matched.

The openb trace names models but not their memory, and a Kubernetes node often says only its
model (``aliyun.accelerator/nvidia_name: Tesla-T4``). Turning a share of a GPU into GPU memory,
or memory into a share, needs the card's size, so the trace's per-model table (BENCHMARKS.md)
lives here, with name matching loose enough for the labels NVIDIA's and Alibaba's tools write.
"""

from __future__ import annotations

import re

MEMORY_MIB = {
    "T4": 15109,
    "V100M16": 16160,
    "P100": 16280,
    "A10": 22731,
    "V100M32": 32510,
    "G2": 20000,
    "G3": 30000,
}
"""Per-model memory in MiB (the trace's models; G2 and G3 are its undisclosed internal codes)."""


def _key(model: str) -> str:
    """``Tesla-T4``, ``NVIDIA A10`` and ``t4`` all become the trace's ``T4``-style key."""
    key = re.sub(r"[^A-Z0-9]", "", model.upper())
    for prefix in ("NVIDIA", "TESLA"):
        key = key.removeprefix(prefix)
    return key


def memory_mib(model: str) -> int | None:
    """The model's memory in MiB, or None when the table does not know it."""
    key = _key(model)
    if key in MEMORY_MIB:
        return MEMORY_MIB[key]
    if key.startswith("V100"):  # V100-SXM2-32GB, V100-PCIE-16GB, ...
        return MEMORY_MIB["V100M32" if "32" in key[4:] else "V100M16"]
    for known in sorted(MEMORY_MIB, key=len, reverse=True):
        if key.startswith(known) and not key[len(known) :][:1].isdigit():
            return MEMORY_MIB[known]  # T4-16GB, P100-PCIE-16GB, A10-24GB
    return None


def known_models() -> str:
    """The table's models, for messages."""
    return ", ".join(f"{m} ({mib} MiB)" for m, mib in MEMORY_MIB.items())
