"""Whether the plugin's host directories can do what it needs of them, checked at start.

Two host directories, each mounted at the same path in the plugin (the chart's rule):

- ``--isolation-lib-dir`` (``isolation.libHostPath``): the plugin copies the interposer there,
  and every isolated container maps it executable through a read-only mount of it. A bind
  mount keeps the source's ``noexec`` (checked on this project's machine: ``mount --bind`` of a
  directory of a ``noexec`` tmpfs shows ``noexec``), so a directory on a ``noexec`` file system
  starts the plugin but fails every tenant's loader with ``failed to map segment``;
- ``--state-dir`` (``devicePlugin.stateHostPath``): checkpoint, limits, broker sockets.

Platforms differ exactly there. GKE's Container-Optimized OS has ``/`` read-only and ``/var``,
``/home`` writable but mounted ``noexec``, with ``/home/kubernetes/bin`` the writable directory
mounted exec (COS file-system documentation, docs/driver-root.md); Bottlerocket's root, and so
``/usr/local``, is read-only, ``/var/lib`` writable. The default ``/usr/local/gpushare`` fails
on both: the plugin refuses to start, naming the path, the mount flag found, the value to
change and where to point it, rather than a tenant failing later.

A directory that does not exist yet is created (the plugin would create it anyway). The flags
are read with ``statvfs`` (``ST_RDONLY``, ``ST_NOEXEC``) and then tried: a file is written, and
for the library directory mapped with ``PROT_EXEC``, which a security module may refuse where
the flags allow it.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from pathlib import Path

LIB_VALUE = "isolation.libHostPath"
STATE_VALUE = "devicePlugin.stateHostPath"
FLAGS = {LIB_VALUE: "--isolation-lib-dir", STATE_VALUE: "--state-dir"}
HINTS = {
    LIB_VALUE: "a writable directory mounted exec: on GKE's Container-Optimized OS / is "
    "read-only and /var, /home are noexec, but /home/kubernetes/bin is exec (e.g. "
    "/home/kubernetes/bin/gpushare); on Bottlerocket / is read-only, /var/lib writable (e.g. "
    "/var/lib/gpushare-lib)",
    STATE_VALUE: "a writable directory: /var/lib/gpushare is, on GKE's Container-Optimized OS "
    "and on Bottlerocket",
}


def mount_point(path: Path) -> Path:
    """The mount point of the file system holding ``path`` (an existing path)."""
    current = path.resolve()
    while current != current.parent and not os.path.ismount(current):
        current = current.parent
    return current


def _refusal(path: Path, value: str, problem: str) -> str:
    return (
        f"{FLAGS[value]} {path}: {problem}. Set the chart's {value} ({FLAGS[value]}) to "
        f"{HINTS[value]}"
    )


def _ensure(path: Path, value: str) -> str | None:
    """Create ``path`` when missing; why it cannot be; None when it is a directory."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        existing = next((p for p in (path, *path.parents) if p.exists()), Path("/"))
        flag = "read-only" if _flags(existing) & os.ST_RDONLY else err.strerror
        return _refusal(
            path,
            value,
            f"cannot be created ({flag} file system mounted at {mount_point(existing)}: {err})",
        )
    return None


def _flags(path: Path) -> int:
    try:
        return os.statvfs(path).f_flag
    except OSError:
        return 0


def refuse_state_dir(path: Path) -> str | None:
    """Why the state directory cannot serve (missing and not creatable, read-only); None if fine."""
    return _ensure(path, STATE_VALUE) or _refuse_writes(path, STATE_VALUE)


def refuse_lib_dir(path: Path) -> str | None:
    """Why the interposer's directory cannot serve (not writable, or not exec-mappable)."""
    refused = _ensure(path, LIB_VALUE) or _refuse_writes(path, LIB_VALUE)
    if refused is not None:
        return refused
    if _flags(path) & os.ST_NOEXEC:
        return _refusal(
            path,
            LIB_VALUE,
            f"on a noexec file system (mounted at {mount_point(path)}): containers could not "
            f"map the interposer library executable ('failed to map segment')",
        )
    return _refuse_exec_map(path)


def _refuse_writes(path: Path, value: str) -> str | None:
    if _flags(path) & os.ST_RDONLY:
        return _refusal(path, value, f"on a read-only file system (mounted at {mount_point(path)})")
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".gpushare-write-check-"):
            pass
    except OSError as err:
        return _refusal(path, value, f"not writable ({err})")
    return None


def _refuse_exec_map(path: Path) -> str | None:
    try:
        with tempfile.TemporaryFile(dir=path, prefix=".gpushare-exec-check-") as probe:
            probe.write(b"\0" * mmap.PAGESIZE)
            probe.flush()
            mapped = mmap.mmap(probe.fileno(), mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_EXEC)
            mapped.close()
    except OSError as err:
        return _refusal(
            path,
            LIB_VALUE,
            f"a file there cannot be mapped executable ({err}), as containers must map the "
            f"interposer library",
        )
    return None
