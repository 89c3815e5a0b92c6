"""Per-container state on the host: each container's directory name, and pruning those of gone
containers.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from pathlib import Path

from gpushare.node.enforcement.hook import Target

log = logging.getLogger(__name__)

BY_DEVICES = "by-devices"
PRUNE_GRACE_S = 60.0
"""Per-container directories younger than this are kept: the live lists may predate them."""
PER_CONTAINER = ("broker", "limits", "accounting")
"""The state directory's per-container kinds (``accounting``: usage tables of older plugins)."""


def devices_key(device_ids: tuple[str, ...]) -> str:
    """The directory name of a container known only by its device IDs."""
    return hashlib.sha256(",".join(sorted(device_ids)).encode()).hexdigest()[:16]


def accounting_key(target: Target) -> str:
    """The container's name in the state directory: ``<uid>/<container>`` or by device IDs."""
    who = {(c.uid, c.container) for c in target.candidates}
    if len(who) == 1:
        uid, container = next(iter(who))
        if uid and "/" not in uid and container and "/" not in container:
            return f"{uid}/{container}"
    return f"{BY_DEVICES}/{devices_key(target.device_ids)}"


def pod_of(key: str, target: Target | None = None) -> str:
    """What the broker's pod cap counts a container's connections under.

    The pod's UID when the key or the candidates name one pod; otherwise the key itself, until
    PodResources names the pod (``InterposerIsolation.weigh``).
    """
    uid, _, _ = key.partition("/")
    if uid != BY_DEVICES:
        return uid
    uids = {c.uid for c in target.candidates} if target is not None else set()
    return uids.pop() if len(uids) == 1 else key


def prune_accounting(
    root: Path,
    live_uids: frozenset[str],
    live_devices: frozenset[tuple[str, ...]],
    *,
    now: float,
    grace_s: float = PRUNE_GRACE_S,
) -> list[Path]:
    """Remove the per-container directories of gone containers older than the grace; list them."""
    keep_devices = {devices_key(d) for d in live_devices}
    candidates = [
        *(p for p in _children(root) if p.name != BY_DEVICES and p.name not in live_uids),
        *(p for p in _children(root / BY_DEVICES) if p.name not in keep_devices),
    ]
    removed = []
    for path in candidates:
        try:
            young = now - path.stat().st_mtime < grace_s
        except OSError:
            continue
        if not young:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _children(path: Path) -> list[Path]:
    try:
        return [p for p in path.iterdir() if p.is_dir()]
    except OSError:
        return []
