"""The interposer library and the preload list, installed on the host for containers to mount."""

from __future__ import annotations

import logging
import shutil
from importlib import resources
from pathlib import Path

from gpushare.core.admitting.isolationpaths import CONTAINER_LIB_DIR
from gpushare.isolation.build import LIB_NAME

log = logging.getLogger(__name__)

DEFAULT_LIB_DIR = Path("/usr/local/gpushare")
PRELOAD_NAME = "ld.so.preload"
"""The host file, in the library directory, that containers see as /etc/ld.so.preload."""


def packaged(name: str) -> Path | None:
    """A native file built into this package (``gpushare/isolation/native``), if it was built."""
    try:
        path = Path(str(resources.files("gpushare.isolation") / "native" / name))
    except ModuleNotFoundError:
        return None
    return path if path.is_file() else None


def packaged_library() -> Path | None:
    """The interposer built into this package, if the build produced it."""
    return packaged(LIB_NAME)


def install_library(source: Path | None, lib_dir: Path) -> str | None:
    """Copy the library into ``lib_dir`` (atomically); why it is unusable; None when done."""
    target = lib_dir / LIB_NAME
    if source is None:
        if target.is_file():
            log.warning("no packaged %s; serving the one already in %s", LIB_NAME, lib_dir)
            return None
        return (
            f"isolation needs the interposer library {LIB_NAME}, but this gpushare package has "
            f"none (gpushare/isolation/native/{LIB_NAME}) and {lib_dir} has none either: build "
            f"it (python -m gpushare.isolation.build, or the image), or start with "
            f"--isolation none to serve this node without isolation"
        )
    try:
        lib_dir.mkdir(parents=True, exist_ok=True)
        tmp = lib_dir / f".{LIB_NAME}.tmp"
        shutil.copyfile(source, tmp)
        tmp.chmod(0o755)
        # a rename: running containers keep the file they mapped
        tmp.replace(target)
    except OSError as err:
        return f"cannot install {LIB_NAME} into --isolation-lib-dir {lib_dir}: {err}"
    return None


def install_preload(lib_dir: Path) -> str | None:
    """Write the preload list naming the library (atomically); why it failed; None when done."""
    try:
        write_atomically(lib_dir / PRELOAD_NAME, f"{CONTAINER_LIB_DIR}/{LIB_NAME}\n", 0o644)
    except OSError as err:
        return f"cannot write {PRELOAD_NAME} into --isolation-lib-dir {lib_dir}: {err}"
    return None


def write_atomically(path: Path, text: str, mode: int) -> None:
    """Write through a temporary file and a rename: a reader sees the old file or the new."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp"
    tmp.write_text(text)
    tmp.chmod(mode)
    tmp.replace(path)
