"""A CDI spec for the real node's fake GPUs, in place of the one ``nvidia-ctk cdi generate`` writes.

Under the ``cdi-cri`` device-list strategy the device plugin names, in each Allocate answer, the
CDI devices of the GPUs it placed (``nvidia.com/gpu=<UUID>``), kubelet hands the names to the
runtime through CRI, and containerd 2 applies the edits the spec gives each device. On a GPU
node the NVIDIA Container Toolkit writes that spec; here there is no driver, so the real node
writes this double before containerd and the plugin start, shaped as the toolkit shapes its own,
and each device adds something a container can be checked for from inside: its device node and
an environment variable naming it.

Facts it follows (checked against the sources, not copied from them):

- The CDI specification, ``tags.cncf.io/container-device-interface`` (``SPEC.md``, ``pkg/parser``,
  ``specs-go/version.go``; containerd v2.2.9 builds against v1.1.0 of the module). A spec file
  in a spec directory ends ``.json`` or ``.yaml`` and holds ``cdiVersion``, ``kind`` and
  ``devices``; each device has a ``name`` and ``containerEdits`` (``env`` as ``NAME=value``
  strings, ``deviceNodes`` with ``path`` inside the container and an optional ``hostPath``,
  ``type``, ``major``, ``minor``, ``permissions``). A container asks for a device by its
  qualified name ``vendor/class=name``: vendor and class start with a letter, end with a letter
  or digit, and hold letters, digits, ``_``, ``-`` and ``.``; a device name starts and ends with
  a letter or digit and may also hold ``:``. A device name that starts with a digit, and a
  ``hostPath``, both need ``cdiVersion`` 0.5.0 or later, the least this double needs, so it
  declares that (the library refuses a spec whose version is below what its fields need).
- The NVIDIA Container Toolkit (``cmd/nvidia-ctk/cdi/generate``, ``pkg/nvcdi``): vendor
  ``nvidia.com`` and class ``gpu`` by default, so the kind is ``nvidia.com/gpu``; the device-name
  strategies ``index`` (``0``, ``1``, ...), ``uuid`` (the GPU's NVML UUID, ``GPU-...``) and
  ``type-index`` (``gpu0``); one spec device per name and strategy, each with the same edits for
  its GPU (its ``/dev/nvidia<minor>`` node); and a merged device ``all`` holding every GPU's
  edits. The nodes every GPU shares (``/dev/nvidiactl``, ``/dev/nvidia-uvm``) and the driver's
  libraries sit in the spec-wide edits; the fake GPUs have no driver, so the double has none.

The host nodes are character devices with ``/dev/null``'s numbers (1:3) under the node's own
directory, so a container that gets one can open it harmlessly, and the device cgroup already
lets every container read and write 1:3. Which GPU a node stands for is its container path.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

KIND = "nvidia.com/gpu"
"""What ``nvidia-ctk cdi generate`` writes by default (``--vendor nvidia.com --class gpu``)."""
CDI_VERSION = "0.5.0"
"""The least version whose fields the double uses (index names start with a digit; hostPath)."""
SPEC_FILE = "nvidia.yaml"
"""The toolkit's usual file name (the GPU Operator writes ``/var/run/cdi/nvidia.yaml``)."""
ENV_PREFIX = "GPUSHARE_FAKE_CDI_DEVICE_"
"""Each device's edits set ``<prefix><index>=<uuid>``; the probe prints every such variable."""

_VENDOR_OR_CLASS = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


@dataclass(frozen=True)
class FakeGpu:
    """One GPU as the device plugin's fake source reports it."""

    index: int
    uuid: str


def container_path(index: int) -> str:
    """Where GPU ``index``'s node appears in a container, as the driver names it on a host."""
    return f"/dev/nvidia{index}"


def name_problems(kind: str, names: Sequence[str]) -> list[str]:
    """What in ``kind`` or the device ``names`` breaks the CDI naming rules (empty: nothing)."""
    problems = []
    vendor, slash, cls = kind.partition("/")
    if not slash or not _VENDOR_OR_CLASS.match(vendor) or not _VENDOR_OR_CLASS.match(cls):
        problems.append(
            f"kind {kind!r}: write vendor/class, each starting with a letter and ending with a "
            "letter or digit, with only letters, digits, '_', '-' and '.'"
        )
    for name in names:
        if not _DEVICE_NAME.match(name):
            problems.append(
                f"device name {name!r}: start and end with a letter or digit; only letters, "
                "digits, '_', '-', '.' and ':' between"
            )
    return problems


def spec(gpus: Sequence[FakeGpu], node_dir: Path, kind: str = KIND) -> dict[str, Any]:
    """The spec for ``gpus``: each named by index and by UUID, then ``all``; host nodes in
    ``node_dir``. A ValueError names a name that breaks the CDI rules."""
    devices: list[dict[str, Any]] = []
    every_env: list[str] = []
    every_node: list[dict[str, str]] = []
    for gpu in gpus:
        env = [f"{ENV_PREFIX}{gpu.index}={gpu.uuid}"]
        nodes = [
            {"path": container_path(gpu.index), "hostPath": str(node_dir / f"nvidia{gpu.index}")}
        ]
        edits = {"env": env, "deviceNodes": nodes}
        devices.extend(
            {"name": name, "containerEdits": edits} for name in (str(gpu.index), gpu.uuid)
        )
        every_env.extend(env)
        every_node.extend(nodes)
    devices.append({"name": "all", "containerEdits": {"env": every_env, "deviceNodes": every_node}})
    problems = name_problems(kind, [d["name"] for d in devices])
    if problems:
        raise ValueError("the fake GPUs' CDI spec would be refused: " + "; ".join(problems))
    return {"cdiVersion": CDI_VERSION, "kind": kind, "devices": devices}


def write(spec_dir: Path, node_dir: Path, gpus: Sequence[FakeGpu], kind: str = KIND) -> Path:
    """Make the host nodes and (re)write the spec file atomically; return its path.

    containerd watches its spec directories and reloads a changed file; the temporary name
    ends in neither ``.json`` nor ``.yaml``, so no reader sees half a file.
    """
    content = spec(gpus, node_dir, kind)
    make_nodes(node_dir, [f"nvidia{gpu.index}" for gpu in gpus])
    spec_dir.mkdir(parents=True, exist_ok=True)
    path = spec_dir / SPEC_FILE
    tmp = spec_dir / f".{SPEC_FILE}.tmp"
    tmp.write_text(yaml.safe_dump(content, sort_keys=False))
    tmp.replace(path)
    return path


def make_nodes(node_dir: Path, names: Sequence[str]) -> None:
    """Character devices ``names`` in ``node_dir`` with ``/dev/null``'s numbers (kept if there)."""
    node_dir.mkdir(parents=True, exist_ok=True)
    null = os.stat("/dev/null").st_rdev
    for name in names:
        node = node_dir / name
        if not (node.exists() and stat.S_ISCHR(node.stat().st_mode)):
            node.unlink(missing_ok=True)
            os.mknod(node, 0o666 | stat.S_IFCHR, null)


def seen(env: dict[str, str]) -> tuple[str, str]:
    """(device nodes, CDI variables) a probe saw: ``PROBE_DEVICES`` and the ``<prefix><i>``
    variables as ``i=uuid`` sorted by index, both comma-separated, for comparing as strings."""
    cdi = sorted(
        (int(k.removeprefix(ENV_PREFIX)), v) for k, v in env.items() if k.startswith(ENV_PREFIX)
    )
    return env.get("PROBE_DEVICES", ""), ",".join(f"{i}={u}" for i, u in cdi)


def expected(placed: Sequence[FakeGpu]) -> tuple[str, str]:
    """What :func:`seen` must give for a container placed on exactly ``placed``."""
    ordered = sorted(placed, key=lambda g: g.index)
    return (
        ",".join(container_path(g.index) for g in ordered),
        ",".join(f"{g.index}={g.uuid}" for g in ordered),
    )


__all__ = [
    "CDI_VERSION",
    "ENV_PREFIX",
    "KIND",
    "SPEC_FILE",
    "FakeGpu",
    "container_path",
    "expected",
    "make_nodes",
    "name_problems",
    "seen",
    "spec",
    "write",
]
