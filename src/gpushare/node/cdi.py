"""How Allocate hands the placed GPUs to a container: the device-list strategies.

kubelet passes whatever a device plugin answers on to the container runtime; the GPU itself is
injected by the NVIDIA stack, from one of two things (NVIDIA's own device plugin calls them
device-list strategies, and gpushare uses its names):

- ``envvar``: ``NVIDIA_VISIBLE_DEVICES=<uuid>,...``. The NVIDIA Container Toolkit's runtime hook
  (legacy mode) reads the variable and mounts those GPUs. It works only where the toolkit honours
  the variable for unprivileged containers, and there any pod that sets it itself (an image's
  ``NVIDIA_VISIBLE_DEVICES=all``, or a tenant's) gets GPUs too, which is why the admission
  webhook then refuses it from tenants.
- ``cdi-cri``: ``CDIDevices`` in the Allocate answer, ``<kind>=<uuid>`` for each placed GPU
  (kind ``nvidia.com/gpu`` by default, as ``nvidia-ctk cdi generate`` and the GPU Operator write
  it). kubelet hands them to the runtime through CRI, and containerd 2 (CDI on by default) or
  CRI-O injects exactly the device nodes and edits the node's CDI spec lists for those names.
  The answer also sets ``NVIDIA_VISIBLE_DEVICES=void``, the toolkit's word for "no GPU by this
  variable", so an image's ``all`` cannot add GPUs where a legacy hook still runs. With the
  toolkit's ``accept-nvidia-visible-devices-envvar-when-unprivileged = false`` the variable grants
  an unprivileged pod nothing at all (docs/gpu-operator.md).

- ``driver-root``: for nodes without the NVIDIA container runtime (GKE's Container-Optimized OS).
  The answer itself carries the GPU, as GKE's own device plugin does (``driverroot``): a
  DeviceSpec for ``/dev/nvidia<minor>`` of each placed GPU and for the shared ``nvidiactl``,
  ``nvidia-uvm`` and ``nvidia-uvm-tools`` the host has, and the host's driver directory mounted
  read-only at ``/usr/local/nvidia``. ``NVIDIA_VISIBLE_DEVICES=void`` keeps any hook that does
  run from adding GPUs. The plugin refuses to start when a GPU's device node is missing.

``cdi-cri`` is the default: it is what current GPU nodes run (the GPU Operator enables CDI), and
it is the one strategy under which the variable can be switched off. A name the runtime cannot
resolve fails the container's creation, so the plugin checks before it starts that the node's
CDI specs name every GPU it serves by UUID, and refuses to start otherwise, saying how to
generate the spec or choose ``envvar``.

What the plugin reads of a spec (the CDI specification, ``tags.cncf.io/container-device-interface``,
``specs-go``): the top-level ``kind`` (``vendor/class``) and each device's ``name``; the fully
qualified name is ``kind=name``. Files are ``*.json``, ``*.yaml`` and ``*.yml`` in the spec
directories (``/etc/cdi`` and ``/var/run/cdi`` by default, containerd's ``cdi_spec_dirs``). The
interposer, its limits and the schedules still reach the container as mounts and variables of
the answer, alike under both strategies.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from gpushare.node.driverroot import DeviceSpec, DriverRoot, Mount

DEFAULT_KIND = "nvidia.com/gpu"
DEFAULT_SPEC_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
VOID = "void"
"""``NVIDIA_VISIBLE_DEVICES`` value that injects no GPU (the NVIDIA Container Toolkit's)."""
MAX_SPEC_BYTES = 4 * 2**20
"""A spec file larger than this is skipped (NVIDIA's are a few kB per GPU)."""

# the CDI parser's rules (pkg/parser): vendor and class start with a letter and end with a letter
# or digit; a device name starts and ends with a letter or digit
_VENDOR = re.compile(r"^[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_CLASS = re.compile(r"^[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


class Strategy(StrEnum):
    """How the placed GPUs reach the container (NVIDIA device plugin's names)."""

    ENVVAR = "envvar"
    CDI_CRI = "cdi-cri"
    DRIVER_ROOT = "driver-root"


class HandOffError(ValueError):
    """A strategy or CDI kind is not valid; the message names the field, value and rule."""


def parse_strategy(value: str, field_name: str = "--device-list-strategy") -> Strategy:
    """The strategy for ``value``; HandOffError says what is wrong."""
    try:
        return Strategy(value)
    except ValueError:
        allowed = ", ".join(s.value for s in Strategy)
        raise HandOffError(
            f"{field_name}={value!r} is not a device-list strategy: use {allowed} (cdi-cri "
            f"where the node has the NVIDIA Container Toolkit's CDI spec, envvar where the NVIDIA "
            f"runtime honours NVIDIA_VISIBLE_DEVICES, driver-root where the node has no NVIDIA "
            f"runtime and a driver directory, as GKE's Container-Optimized OS)"
        ) from None


def parse_kind(value: str, field_name: str = "--cdi-kind") -> str:
    """A CDI kind, ``vendor/class`` as the CDI specification defines it."""
    vendor, _, cls = value.partition("/")
    if not (_VENDOR.match(vendor) and "." in vendor and _CLASS.match(cls)):
        raise HandOffError(
            f"{field_name}={value!r} is not a CDI kind: use vendor/class, the vendor a domain "
            f"name (letters, digits, '.', '-', '_'), as in {DEFAULT_KIND}"
        )
    return value


@dataclass(frozen=True)
class SpecScan:
    """What the CDI spec directories hold for one kind."""

    names: frozenset[str]
    """Device names of the kind, across every spec file."""
    files: tuple[str, ...] = ()
    """The spec files that declare the kind."""
    skipped: tuple[str, ...] = ()
    """Files that could not be read or parsed, each with the reason."""


def devices_of(spec: Any, kind: str) -> list[str] | None:
    """The device names a parsed spec declares for ``kind``; None when it is another kind's."""
    if not isinstance(spec, dict) or spec.get("kind") != kind:
        return None
    devices = spec.get("devices")
    if not isinstance(devices, list):
        return []
    return [
        d["name"]
        for d in devices
        if isinstance(d, dict) and isinstance(d.get("name"), str) and _NAME.match(d["name"])
    ]


def scan(dirs: Iterable[Path], kind: str) -> SpecScan:
    """Read every spec file in ``dirs`` (missing directories are empty)."""
    names: set[str] = set()
    files: list[str] = []
    skipped: list[str] = []
    for path in _spec_files(dirs):
        try:
            if path.stat().st_size > MAX_SPEC_BYTES:
                skipped.append(f"{path}: larger than {MAX_SPEC_BYTES} bytes")
                continue
            spec = yaml.safe_load(path.read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
            skipped.append(f"{path}: {type(err).__name__}")
            continue
        found = devices_of(spec, kind)
        if found is not None:
            files.append(str(path))
            names.update(found)
    return SpecScan(frozenset(names), tuple(files), tuple(skipped))


def _stat_specs(dirs: Iterable[Path]) -> tuple[tuple[str, int, int, int], ...]:
    """Path, inode, size and modification time of every spec file in ``dirs``."""
    found = []
    for path in _spec_files(dirs):
        try:
            st = path.stat()
        except OSError:
            continue
        found.append((str(path), st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(found)


def _spec_files(dirs: Iterable[Path]) -> Iterator[Path]:
    """The spec files of ``dirs`` in name order (a missing or unreadable directory is empty)."""
    for directory in dirs:
        try:
            entries = sorted(directory.iterdir())
        except OSError:
            continue
        yield from (path for path in entries if path.suffix in (".json", ".yaml", ".yml"))


@dataclass
class HandOff:
    """The node's strategy, and under ``cdi-cri`` the device names its CDI specs hold."""

    strategy: Strategy = Strategy.ENVVAR
    kind: str = DEFAULT_KIND
    spec_dirs: Sequence[Path] = DEFAULT_SPEC_DIRS
    scanned: SpecScan = field(default_factory=lambda: SpecScan(frozenset()))
    _seen: tuple[tuple[str, int, int, int], ...] | None = field(default=None, repr=False)
    """What the spec files were (path, inode, size, mtime) when last parsed."""
    driver_root: DriverRoot | None = None
    """``--driver-root``: where the host's driver is; needed by ``driver-root``, and used by
    any strategy to load NVML."""

    def refresh(self) -> SpecScan:
        """Read the spec directories again (they are the node's; the toolkit may rewrite them).

        Called at every Allocate: the files are parsed again only when one of them changed
        (a stat per file otherwise), so a burst of pod starts does not re-read YAML each time.
        """
        if self.strategy is Strategy.CDI_CRI:
            seen = _stat_specs(self.spec_dirs)
            if seen != self._seen:
                self.scanned = scan(self.spec_dirs, self.kind)
                self._seen = seen
        return self.scanned

    def missing(self, uuids: Iterable[str]) -> list[str]:
        """The UUIDs no CDI device of the kind is named after (always none under envvar)."""
        if self.strategy is not Strategy.CDI_CRI:
            return []
        return [u for u in uuids if u not in self.scanned.names]

    def refusal(self, uuids: Sequence[str], minors: Sequence[int | None] = ()) -> str | None:
        """Why the plugin must not serve these GPUs under the strategy; None when it may.

        ``minors`` are the GPUs' minor numbers, in the order of ``uuids`` (driver-root only).
        """
        if self.strategy is Strategy.DRIVER_ROOT:
            if self.driver_root is None:
                return "device-list strategy driver-root needs --driver-root"
            known = list(minors) + [None] * (len(uuids) - len(minors))
            return self.driver_root.refusal(list(zip(uuids, known, strict=False)))
        if self.strategy is not Strategy.CDI_CRI:
            return None
        self.refresh()
        missing = self.missing(uuids)
        if not missing:
            return None
        dirs = ", ".join(str(d) for d in self.spec_dirs)
        where = (
            f"the specs declaring {self.kind} ({', '.join(self.scanned.files)}) name "
            f"{len(self.scanned.names)} device(s), not these"
            if self.scanned.files
            else f"no spec file in {dirs} declares kind {self.kind}"
        )
        unread = f"; unreadable: {'; '.join(self.scanned.skipped)}" if self.scanned.skipped else ""
        return (
            f"device-list strategy cdi-cri: no CDI device {self.kind}=<uuid> for GPU(s) "
            f"{', '.join(missing)}: {where}{unread}. The container runtime could not inject "
            f"them. Generate the NVIDIA Container Toolkit's spec on this node (nvidia-ctk cdi "
            f"generate --output=/var/run/cdi/nvidia.yaml; the GPU Operator writes it with "
            f"cdi.enabled=true), or set the chart's devicePlugin.deviceListStrategy=envvar "
            f"(--device-list-strategy envvar) where the node has no CDI"
        )

    def answer(self, uuids: Sequence[str], *, carries_devices: bool) -> tuple[str, tuple[str, ...]]:
        """``NVIDIA_VISIBLE_DEVICES`` and the CDI device names of one container's answer.

        kubelet merges the answers of every resource a container asks for; only the one that
        ``carries_devices`` (memory: every gpushare container asks for it) names CDI devices,
        so no name is asked of the runtime twice.
        """
        if self.strategy is Strategy.ENVVAR:
            return ",".join(uuids), ()
        if self.strategy is Strategy.DRIVER_ROOT:
            return VOID, ()
        devices = tuple(f"{self.kind}={u}" for u in uuids) if carries_devices else ()
        return VOID, devices

    def host_edits(
        self, minors: Sequence[int], *, carries_devices: bool
    ) -> tuple[tuple[DeviceSpec, ...], tuple[Mount, ...]]:
        """The device nodes and mounts of one container's answer (driver-root; else none).

        Like the CDI names, only the answer that ``carries_devices`` names them: kubelet merges
        the answers of a container's resources, and one copy is enough.
        """
        if self.strategy is not Strategy.DRIVER_ROOT or self.driver_root is None:
            return (), ()
        if not carries_devices:
            return (), ()
        return self.driver_root.devices(minors), (self.driver_root.mount(),)
