"""The runtime hook that checks the isolation mounts, run as runc runs it.

runc calls a createRuntime hook after it has made every mount of the container, in the
container's own mount namespace, and before pivot_root; the hook gets the OCI state (the
container's pid and bundle) on stdin and reads ``config.json`` from the bundle (OCI runtime-spec
``config.md`` and ``runtime.md``; runc ``libcontainer/rootfs_linux.go``). Each test here builds
that moment by hand: a root filesystem, a process in a private mount namespace that makes the
mounts the way runc would (a destination through a link in the image is resolved inside the
root first, which is what moves a volume over the plugin's), and the hook run against that
process. The real-node test (``tests/e2e/test_real_cgpu.py``) runs it under containerd and runc.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpushare.isolation.build import build_mountcheck

CI = os.environ.get("CI") == "true"


def _unavailable() -> str:
    if os.geteuid() != 0:
        return "making mounts in a private namespace needs root"
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return "util-linux's unshare and mount are not installed"
    return ""


pytestmark = pytest.mark.skipif(
    bool(_unavailable()) and not CI, reason=_unavailable() or "runs as root"
)


@pytest.fixture(scope="module")
def hook(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_mountcheck(tmp_path_factory.mktemp("hook") / "gpushare-mountcheck")


@dataclass
class Container:
    """A bundle, its root filesystem and the plugin's host directories."""

    base: Path
    mounts: list[dict[str, object]] = field(default_factory=list)
    script: list[str] = field(default_factory=list)

    @property
    def rootfs(self) -> Path:
        return self.base / "bundle" / "rootfs"

    @property
    def state(self) -> Path:
        return self.base / "state"

    @property
    def lib(self) -> Path:
        return self.base / "lib"

    def at(self, inside: str) -> Path:
        """Where a path inside the container is on the host, links in the image resolved."""
        here = self.rootfs
        parts = [p for p in inside.split("/") if p]
        hops = 0
        while parts:
            part = parts.pop(0)
            candidate = here / part
            if candidate.is_symlink():
                hops += 1
                assert hops < 40
                target = os.readlink(candidate)
                parts = [p for p in target.split("/") if p] + parts
                here = self.rootfs if target.startswith("/") else here
                continue
            here = candidate
        return here

    def bind(self, source: Path, dest: str, *, ro: bool = True) -> None:
        """A mount as kubelet's CRI asks for it, made as runc makes it."""
        target = self.at(dest)
        if source.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()
        options = ["rbind", "rprivate", "ro" if ro else "rw"]
        self.mounts.append({"destination": dest, "type": "bind", "source": str(source),
                            "options": options})  # fmt: skip
        self.script.append(f"mount --bind '{source}' '{target}'")
        if ro:
            self.script.append(f"mount -o remount,bind,ro '{target}'")

    def empty_dir(self, dest: str) -> None:
        """The pod's own volume: a fresh directory mounted at ``dest``."""
        volume = self.base / "volumes" / dest.strip("/").replace("/", "_")
        volume.mkdir(parents=True)
        self.bind(volume, dest, ro=False)

    def run(self, hook: Path) -> subprocess.CompletedProcess[str]:
        """Make the mounts in a private namespace, then run the hook on it."""
        bundle = self.base / "bundle"
        config = {"ociVersion": "1.2.0", "root": {"path": "rootfs"}, "mounts": self.mounts}
        (bundle / "config.json").write_text(json.dumps(config))
        script = " && ".join([*self.script, "echo ready", "exec sleep 60"])
        with subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as holder:
            try:
                assert holder.stdout is not None and holder.stderr is not None
                line = holder.stdout.readline()
                assert line.strip() == "ready", holder.stderr.read()
                state = {"ociVersion": "1.2.0", "id": "c1", "status": "creating",
                         "pid": holder.pid, "bundle": str(bundle)}  # fmt: skip
                return subprocess.run(
                    [str(hook), "--under", str(self.state), "--under", str(self.lib)],
                    input=json.dumps(state),
                    capture_output=True,
                    text=True,
                    timeout=30,
                    check=False,
                )
            finally:
                holder.kill()


@pytest.fixture
def container(tmp_path: Path) -> Iterator[Container]:
    c = Container(tmp_path)
    c.rootfs.mkdir(parents=True)
    for d in ("etc", "run", "usr/local", "tmp"):
        (c.rootfs / d).mkdir(parents=True)
    (c.rootfs / "var").mkdir()
    (c.rootfs / "var" / "run").symlink_to("/run")  # as in Debian's and most images
    (c.state / "sched").mkdir(parents=True)
    for gpu in range(2):
        (c.state / "sched" / f"gpu{gpu}").write_text("schedule\n")
    (c.state / "limits" / "uid" / "main").mkdir(parents=True)
    (c.state / "limits" / "uid" / "main" / "limits").write_text("mem 5368709120\n")
    (c.state / "broker" / "uid" / "main").mkdir(parents=True)
    (c.state / "broker" / "uid" / "main" / "broker.sock").write_text("")
    c.lib.mkdir()
    (c.lib / "libgpushare-cuda.so").write_text("lib")
    (c.lib / "ld.so.preload").write_text("/usr/local/gpushare/libgpushare-cuda.so\n")
    yield c


def isolate(c: Container) -> None:
    """The plugin's mounts of a cgpu container, in the order of its Allocate answer."""
    c.bind(c.lib, "/usr/local/gpushare")
    c.bind(c.lib / "ld.so.preload", "/etc/ld.so.preload")
    c.bind(c.state / "limits" / "uid" / "main" / "limits", "/etc/gpushare/limits")
    c.bind(c.state / "broker" / "uid" / "main", "/var/run/gpushare")
    c.bind(c.state / "sched", "/var/run/gpushare-sched")


def test_the_plugins_mounts_as_given_pass(container: Container, hook: Path) -> None:
    isolate(container)
    container.empty_dir("/data")  # a volume elsewhere is the pod's business
    done = container.run(hook)
    assert done.returncode == 0, done.stderr


def test_a_volume_through_an_image_link_over_the_schedules_is_refused(
    container: Container, hook: Path
) -> None:
    (container.rootfs / "x" / "y" / "z").mkdir(parents=True)
    (container.rootfs / "x" / "y" / "z" / "sched").symlink_to("/var/run/gpushare-sched")
    isolate(container)
    container.empty_dir("/x/y/z/sched")
    done = container.run(hook)
    assert done.returncode == 1
    assert "/var/run/gpushare-sched in the container is not the plugin's" in done.stderr
    assert "container c1 refused" in done.stderr


@pytest.mark.parametrize(
    ("link", "target", "refused"),
    [
        ("opt/conf", "../etc/gpushare", "/etc/gpushare/limits"),  # a relative link, too
        ("cfg", "/etc", "/etc/ld.so.preload"),  # the preload list's directory
        ("lib", "/usr/local/gpushare", "/usr/local/gpushare"),
        ("sock", "/var/run/gpushare", "/var/run/gpushare"),
    ],
)
def test_a_volume_through_a_link_over_other_isolation_is_refused(
    container: Container, hook: Path, link: str, target: str, refused: str
) -> None:
    (container.rootfs / link).parent.mkdir(parents=True, exist_ok=True)
    (container.rootfs / link).symlink_to(target)
    isolate(container)
    container.empty_dir(f"/{link}")
    done = container.run(hook)
    assert done.returncode == 1
    assert f"refused: {refused} " in done.stderr


def test_a_file_over_one_schedule_is_refused(container: Container, hook: Path) -> None:
    (container.rootfs / "mine").symlink_to("/run/gpushare-sched/gpu1")
    isolate(container)
    forged = container.base / "forged"
    forged.write_text("my schedule\n")
    container.bind(forged, "/mine", ro=False)
    done = container.run(hook)
    assert done.returncode == 1
    assert "/var/run/gpushare-sched/gpu1 is not the plugin's" in done.stderr


def test_a_mount_made_writable_is_refused(container: Container, hook: Path) -> None:
    container.bind(container.state / "sched", "/var/run/gpushare-sched", ro=False)
    container.mounts[-1]["options"] = ["rbind", "ro"]  # asked read-only, landed writable
    done = container.run(hook)
    assert done.returncode == 1
    assert "not read-only" in done.stderr


def test_a_link_out_of_the_root_stays_inside_it(container: Container, hook: Path) -> None:
    """An image link to the host's own file reaches the container's path, never the host's."""
    limits = container.state / "limits" / "uid" / "main"
    (container.rootfs / "etc" / "gpushare").symlink_to("../" * 12 + str(limits).lstrip("/"))
    # the mount asked for, not made: were the link followed on the host, the file would match
    asked = {"destination": "/etc/gpushare/limits", "type": "bind", "options": ["rbind", "ro"]}
    container.mounts.append({**asked, "source": str(limits / "limits")})
    done = container.run(hook)
    assert done.returncode == 1
    assert "/etc/gpushare/limits" in done.stderr


@pytest.mark.parametrize(
    "state",
    ["", "not json", '{"pid": 0, "bundle": "/"}', '{"pid": 1}', '{"bundle": "/nonexistent"}'],
)
def test_a_state_it_cannot_read_refuses(hook: Path, state: str) -> None:
    done = subprocess.run(
        [str(hook), "--under", "/var/lib/gpushare"],
        input=state,
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    assert done.returncode == 1
    assert "gpushare-mountcheck: container" in done.stderr


def test_no_directory_to_watch_is_a_usage_error(hook: Path) -> None:
    done = subprocess.run([str(hook)], input="{}", capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert "--under" in done.stderr
