"""A node's GPU memory in use, as its device plugin last published it (pure).

The device plugin knows, on ``cgpu`` and ``core_mem`` nodes, how much GPU memory each
container's processes hold (the interposer's broker counts it). Its metrics give that per
container; this is the small per-GPU summary it writes on the node
(``gpushare.io/gpu-used``), so that ``kubectl inspect cgpu -d`` can show use beside allocation
with nothing more than the node read it does anyway.

Why a node annotation rather than reading the plugins' metrics: the metrics are reached through
the API server's proxy (``pods/proxy`` or ``nodes/proxy``), rights that reach far more than
numbers, and they name every tenant's pods; the annotation holds one number per GPU and no pod
names, and whoever may read the node may read it. It costs a node write, so the plugin writes
only when a GPU's use moved by at least one memory unit, and at most once per interval
(``--used-summary-interval``, 5 minutes by default): the figure may be that old, and the value
says when it was taken.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from gpushare.core.model.names import ANN_NODE_GPU_USED


class UsedSummary(msgspec.Struct, frozen=True):
    """MiB in use per GPU index, and when that was read (UTC, RFC 3339)."""

    at: str
    used_mib: dict[str, int]

    def on(self, index: int) -> int | None:
        """MiB in use on a GPU, or None when the summary does not name it."""
        return self.used_mib.get(str(index))


def render_used(used_mib: Mapping[int, int], at: str) -> str:
    """The annotation's value."""
    summary = UsedSummary(at=at, used_mib={str(i): used_mib[i] for i in sorted(used_mib)})
    return msgspec.json.encode(summary).decode()


def read_used(annotations: Mapping[str, str] | None) -> UsedSummary | None:
    """The node's summary, or None when it has none or it does not parse (nothing is shown)."""
    text = (annotations or {}).get(ANN_NODE_GPU_USED)
    if not text:
        return None
    try:
        summary = msgspec.json.decode(text, type=UsedSummary)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if any(not k.isdigit() or v < 0 for k, v in summary.used_mib.items()):
        return None
    return summary


def moved(old: Mapping[int, int] | None, new: Mapping[int, int], step_mib: int) -> bool:
    """Whether a GPU's use moved by ``step_mib`` or more since ``old`` (None: never written)."""
    if old is None or set(old) != set(new):
        return True
    return any(abs(new[i] - old[i]) >= step_mib for i in new)
