"""The start checks of the plugin's host directories (issue 59; PLATFORMS.md B4, G4).

As root, the file systems are real tmpfs mounts with ``ro`` or ``noexec`` (a bind mount of such
a directory keeps the flag, which is how a hostPath reaches the plugin's container); otherwise
``statvfs`` is made to say so.
"""

from __future__ import annotations

import mmap
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpushare.node import hostpaths
from gpushare.node.hostpaths import refuse_lib_dir, refuse_state_dir


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[dict[str, Path]]:
    """tmpfs mounts ``ro``, ``noexec`` and plain (root only); statvfs faked otherwise."""
    made: list[Path] = []
    found = {}
    can_mount = os.geteuid() == 0
    for name, options in (("ro", "ro"), ("noexec", "noexec"), ("plain", "rw")):
        where = tmp_path / name
        where.mkdir()
        if can_mount:
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"{options},size=1m", "tmpfs", str(where)],
                capture_output=True,
            )
            can_mount = done.returncode == 0
            if can_mount:
                made.append(where)
        found[name] = where
    yield found
    for where in reversed(made):
        subprocess.run(["umount", str(where)], check=False)


@pytest.fixture
def flags(mounted: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """Where tmpfs could not be mounted, statvfs reports the flags the mount would have."""
    if os.path.ismount(mounted["ro"]):
        return mounted
    real = os.statvfs
    flag = {mounted["ro"]: os.ST_RDONLY, mounted["noexec"]: os.ST_NOEXEC}

    class Faked:
        def __init__(self, path: Path, f_flag: int) -> None:
            self.f_flag = f_flag

    def statvfs(path: os.PathLike[str] | str) -> object:
        for top, value in flag.items():
            if Path(path) == top or top in Path(path).parents:
                return Faked(Path(path), value)
        return real(path)

    monkeypatch.setattr(hostpaths.os, "statvfs", statvfs)
    return mounted


def test_a_lib_dir_on_a_read_only_file_system_is_refused_naming_the_value(
    flags: dict[str, Path],
) -> None:
    path = flags["ro"] / "gpushare"
    message = refuse_lib_dir(path)
    assert message is not None
    assert message.startswith(f"--isolation-lib-dir {path}: ")
    assert "read-only file system mounted at" in message or "on a read-only" in message
    if os.path.ismount(flags["ro"]):  # a real mount: the directory cannot even be created
        assert f"cannot be created (read-only file system mounted at {flags['ro']}" in message
    assert "Set the chart's isolation.libHostPath (--isolation-lib-dir)" in message
    assert "/home/kubernetes/bin is exec" in message and "/var/lib/gpushare-lib" in message


def test_a_lib_dir_on_a_noexec_file_system_is_refused(flags: dict[str, Path]) -> None:
    path = flags["noexec"] / "gpushare"
    message = refuse_lib_dir(path)
    assert message is not None
    assert message.startswith(f"--isolation-lib-dir {path}: on a noexec file system")
    assert "failed to map segment" in message
    assert "isolation.libHostPath" in message


def test_a_state_dir_may_be_noexec_but_not_read_only(flags: dict[str, Path]) -> None:
    assert refuse_state_dir(flags["noexec"] / "state") is None
    message = refuse_state_dir(flags["ro"])
    assert message is not None
    assert message.startswith(f"--state-dir {flags['ro']}: on a read-only file system")
    assert "Set the chart's devicePlugin.stateHostPath (--state-dir)" in message


def test_writable_exec_directories_pass_and_are_created(flags: dict[str, Path]) -> None:
    lib, state = flags["plain"] / "a" / "lib", flags["plain"] / "state"
    assert refuse_lib_dir(lib) is None and lib.is_dir()
    assert refuse_state_dir(state) is None and state.is_dir()
    assert list(lib.iterdir()) == []  # the probes leave nothing behind


def test_an_exec_mapping_refused_where_the_flags_allow_it_is_refused_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A security module may refuse PROT_EXEC on a file system mounted exec."""

    def refuse(*args: object, **kwargs: object) -> mmap.mmap:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(hostpaths.mmap, "mmap", refuse)
    message = refuse_lib_dir(tmp_path)
    assert message is not None
    assert "cannot be mapped executable ([Errno 1] Operation not permitted)" in message
