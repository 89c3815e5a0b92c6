"""Where the GPU isolation shows up inside a container: the one list of its container paths.

The device plugin mounts the isolation into every container it serves (the interposer, the
preload list, the limits file, the accounting broker's socket directory, the cGPU schedules,
the MPS pipe directory), and admission refuses a pod's own volume at any of those paths or
below them (``core.admitting.tampering``): kubelet lists the pod's mounts after the plugin's and the
runtime mounts them in that order, so a volume at the same path replaces what the plugin put
there, and the tenant writes its own limits or schedule. The two lists used to be kept apart
and drifted (the schedule directory was mounted and not refused), so both read this one; the
plugin's Allocate answers are checked against it in every mode and cGPU policy
(``tests/integration/deviceplugin/test_isolation_paths.py``).

This sits in the core, the lowest layer, because admission (core) and the device plugin and
isolation (above it) all read it. Paths under ``/var/run`` are refused under ``/run`` too: in
most images one is a link to the other, so a volume at either lands in the same directory.
"""

from __future__ import annotations

import posixpath

CONTAINER_LIB_DIR = "/usr/local/gpushare"
"""The interposer library's directory."""
CONTAINER_PRELOAD_FILE = "/etc/ld.so.preload"
"""glibc's preload list, naming the interposer for every program, setuid ones included."""
CONTAINER_LIMITS_DIR = "/etc/gpushare"
CONTAINER_LIMITS_FILE = f"{CONTAINER_LIMITS_DIR}/limits"
"""The container's limits (``gpushare.isolation.limits``); compiled into the interposer."""
CONTAINER_BROKER_DIR = "/var/run/gpushare"
"""The accounting broker's socket directory (``gpushare.node.enforcement.broker``)."""
CONTAINER_SCHED_DIR = "/var/run/gpushare-sched"
"""The node's cGPU schedule files, one per host GPU (``gpushare.isolation.policy``)."""
CONTAINER_MPS_PIPE_DIR = "/var/run/gpushare-mps"
"""The GPU's MPS control daemon pipe directory, on ``mps`` nodes."""

MOUNTED = (
    CONTAINER_LIB_DIR,
    CONTAINER_PRELOAD_FILE,
    CONTAINER_LIMITS_DIR,
    CONTAINER_BROKER_DIR,
    CONTAINER_SCHED_DIR,
    CONTAINER_MPS_PIPE_DIR,
)
"""Every container path the device plugin mounts, or (the limits file) the directory it is in."""

RUN_ALIASES = ("/var/run/", "/run/")


def aliases(path: str) -> tuple[str, ...]:
    """The path and, for one under ``/var/run`` or ``/run``, the same under the other."""
    for prefix in RUN_ALIASES:
        if path.startswith(prefix):
            rest = path.removeprefix(prefix)
            return (path, *(f"{p}{rest}" for p in RUN_ALIASES if p != prefix))
    return (path,)


ISOLATION_PATHS = tuple(alias for path in MOUNTED for alias in aliases(path))
"""Container paths admission keeps free of a pod's own volumes (at them or below)."""


def covered_by(mount_path: str) -> str:
    """The isolation path a mount path is, or lies under; "" when none."""
    normal = posixpath.normpath(mount_path) if mount_path else ""
    normal = "/" + normal.lstrip("/")  # normpath keeps a leading "//"
    return next((p for p in ISOLATION_PATHS if normal == p or normal.startswith(p + "/")), "")
