"""DRA mode's wire names, gathered from core.model.names so DRA code imports one place.

The names live in core.model.names (the one home of wire names); this module re-exports the DRA
ones for the DRA core and its adapters.
"""

from __future__ import annotations

from gpushare.core.model.names import (
    ALLOCATION_MODE_DEVICE_PLUGIN,
    ALLOCATION_MODE_DRA,
    ANN_DRA_REQUESTS,
    DRA_CAPACITY_CORES,
    DRA_CAPACITY_MEMORY,
    DRA_CLAIM_NAME,
    DRA_DEVICE_CLASS,
    DRA_DRIVER,
    DRA_SCHEDULING_GATE,
    LABEL_ALLOCATION_MODE,
)

__all__ = [
    "ALLOCATION_MODE_DEVICE_PLUGIN",
    "ALLOCATION_MODE_DRA",
    "ANN_DRA_REQUESTS",
    "DRA_CAPACITY_CORES",
    "DRA_CAPACITY_MEMORY",
    "DRA_CLAIM_NAME",
    "DRA_DEVICE_CLASS",
    "DRA_DRIVER",
    "DRA_SCHEDULING_GATE",
    "LABEL_ALLOCATION_MODE",
]
