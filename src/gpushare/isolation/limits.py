"""The limits file: a container's GPU share, where the container cannot change it.

The device plugin gives the interposer each container's limits twice: as environment
variables (``GPUSHARE_MEM_LIMIT``, ``GPUSHARE_CORE_LIMIT``), which people read, and as this
file, written on the host under the state directory and mounted read-only at
``/etc/gpushare/limits`` (``core.admitting.isolationpaths``). Environment is the container's own:
kubelet puts the pod's ``env`` after the plugin's, and any process may change it for the
programs it starts. A read-only bind mount is not: an unprivileged container can neither
write it nor unmount it. So the interposer reads the file first, and the file wins.

The format is the interposer's (``native/interposer.c``, ``gs_parse_file``), version 2: lines
``key=value`` without spaces, ``#`` lines are comments, ``version=2`` first, then every one of
``mem_limit`` (bytes, one value for every visible GPU or one per GPU in order, as in
``GPUSHARE_MEM_LIMIT``), ``core_limit`` (SM percent, 0 for none), ``unit`` (the memory unit the
limit was counted in, for people) and ``broker`` (the container path of the accounting broker's
socket, ``gpushare.isolation.accounting``), each once, and ``uuids``, the NVML UUID of each of
the container's GPUs in the order of its limits, which the plugin writes whenever it knows them
(:data:`UUID_FORM`); the file ends with a newline (so a cut-short file is told from a whole one).
The interposer finds each CUDA device's limit by the device's UUID (``cuDeviceGetUuid``), never by
its CUDA ordinal: the container chooses its ordinals (``CUDA_VISIBLE_DEVICES`` may list its GPUs in
any order), the UUID stays with the GPU. A file without ``uuids`` (written before it was added)
is read by ordinal, as it was. Anything else makes the interposer refuse every
allocation: a file it cannot read is more likely damage or tampering than an intent to run
without limits. The interposer still reads version 1, which named ``accounting_dir``, a usage
table the container itself wrote; the plugin no longer writes it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from gpushare.core.model.inventory import CORE_PER_GPU
from gpushare.isolation.policy import MAX_WEIGHT, Policy

LIMITS_VERSION = 2
SCHEDULED_VERSION = 3
"""Version 3 adds a cGPU policy's settings (``gpushare.isolation.policy``): ``policy``,
``weight``, ``slot`` (the container's name in the schedules), ``sched_dir`` (where the container
sees the schedule files) and ``gpus`` (the host GPU index of each of its GPUs, in the order of
``mem_limit`` and ``uuids``); its
``core_limit`` is the container's own share, which the interposer keeps to while it cannot use
its schedule (never the whole GPU)."""
UUID_FORM = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
"""NVML's form of a GPU's UUID, which the interposer compares with ``cuDeviceGetUuid``'s 16 bytes.
The fake GPUs of test and kwok nodes (``GPU-fake-<node>-<index>``) are not in it; their limits
files name no UUIDs."""
LIMITS_FILE_NAME = "limits"
MAX_SOCKET_PATH = 107
"""A unix socket path's longest (``sun_path`` is 108 bytes with its NUL)."""


def mem_limit_text(limits_bytes: tuple[int, ...]) -> str:
    """One byte count when every GPU has the same limit, else one per GPU, comma-separated."""
    if not limits_bytes or any(b <= 0 for b in limits_bytes):
        raise ValueError(f"memory limits must be positive byte counts, got {limits_bytes!r}")
    if len(set(limits_bytes)) == 1:
        return str(limits_bytes[0])
    return ",".join(str(b) for b in limits_bytes)


@dataclass(frozen=True)
class ContainerLimits:
    """What one container may use, as the interposer enforces it."""

    mem_limit_bytes: tuple[int, ...]
    """Per GPU, in the order of ``uuids`` (without them, of the container's CUDA ordinals)."""
    core_pct: int
    """SM percent of each GPU; 0 (or 100) means no throttle. Under a cGPU policy (version 3)
    the container's own share (``policy.own_share_pct``), which the interposer keeps to while it
    cannot use its schedule."""
    unit: str
    """The memory unit the limits were counted in (``1GiB``, ``128MiB``); for people."""
    broker: str
    """The container path of the accounting broker's socket."""
    policy: int | None = None
    """A cGPU policy 0..4 whose time slices hold this container (version 3); None: none."""
    weight: int = 1
    slot: str = ""
    sched_dir: str = ""
    gpus: tuple[int, ...] = ()
    uuids: tuple[str, ...] = ()
    """The NVML UUID of each GPU, in the order of ``mem_limit_bytes``; () where not known."""

    def render(self) -> str:
        """The file's text: version 2, or 3 when a policy's schedule holds the container."""
        if not 0 <= self.core_pct <= CORE_PER_GPU:
            raise ValueError(f"core_pct must be 0..{CORE_PER_GPU}, got {self.core_pct}")
        if not self.broker.startswith("/") or len(self.broker.encode()) > MAX_SOCKET_PATH:
            raise ValueError(
                f"broker must be an absolute path of at most {MAX_SOCKET_PATH} bytes, "
                f"got {self.broker!r}"
            )
        for name, value in (("unit", self.unit), ("broker", self.broker)):
            if not value or any(c <= " " or c >= "\x7f" for c in value):
                raise ValueError(f"{name}={value!r} must be non-empty printable ASCII, no spaces")
        scheduled = self.policy is not None
        if scheduled:
            self._check_scheduled()
        self._check_uuids()
        text = (
            "# gpushare: this container's GPU limits, written by the device plugin and read by\n"
            "# libgpushare-cuda.so; they win over GPUSHARE_* in the environment.\n"
            f"version={SCHEDULED_VERSION if scheduled else LIMITS_VERSION}\n"
            f"mem_limit={mem_limit_text(self.mem_limit_bytes)}\n"
            f"core_limit={self.core_pct}\n"
            f"unit={self.unit}\n"
            f"broker={self.broker}\n"
        )
        if self.uuids:
            text += f"uuids={','.join(self.uuids)}\n"
        if scheduled:
            text += (
                f"policy={self.policy}\n"
                f"weight={self.weight}\n"
                f"slot={self.slot}\n"
                f"sched_dir={self.sched_dir}\n"
                f"gpus={','.join(str(g) for g in self.gpus)}\n"
            )
        return text

    def _check_uuids(self) -> None:
        if not self.uuids:
            return
        bad = [u for u in self.uuids if not UUID_FORM.fullmatch(u)]
        if bad or len(self.uuids) > 16 or len(set(self.uuids)) != len(self.uuids):
            raise ValueError(
                f"uuids must be 1..16 distinct GPU UUIDs in NVML's form "
                f"(GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, lower-case hex), got {self.uuids!r}"
            )
        if len(self.mem_limit_bytes) > 1 and len(self.mem_limit_bytes) != len(self.uuids):
            raise ValueError(
                f"uuids names {len(self.uuids)} GPUs but mem_limit has "
                f"{len(self.mem_limit_bytes)} limits: give one limit, or one per GPU"
            )
        if self.gpus and len(self.gpus) != len(self.uuids):
            raise ValueError(
                f"uuids names {len(self.uuids)} GPUs but gpus has {len(self.gpus)}: "
                f"give both in the order of the container's GPUs"
            )

    def _check_scheduled(self) -> None:
        native = int(Policy.NATIVE)
        if self.policy not in range(native):
            raise ValueError(
                f"policy must be 0..{native - 1} for a schedule ({native} has none), "
                f"got {self.policy}"
            )
        if not 1 <= self.weight <= MAX_WEIGHT:
            raise ValueError(f"weight must be 1..{MAX_WEIGHT}, got {self.weight}")
        if not (self.slot.isalnum() and self.slot.isascii() and len(self.slot) <= 32):
            raise ValueError(f"slot must be 1..32 ASCII letters or digits, got {self.slot!r}")
        if not self.sched_dir.startswith("/") or len(self.sched_dir.encode()) > 200:
            raise ValueError(f"sched_dir must be an absolute path, got {self.sched_dir!r}")
        if not self.gpus or len(self.gpus) > 16 or any(not 0 <= g < 1000 for g in self.gpus):
            raise ValueError(f"gpus must be 1..16 host GPU indexes, got {self.gpus!r}")

    @classmethod
    def parse(cls, text: str) -> ContainerLimits:
        """Read back a version 2 or 3 file as :meth:`render` writes it; ValueError says why not.

        The plugin reads its own files when it restarts, to serve each container's account again
        with the limits it was given.
        """
        settings: dict[str, str] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            key, eq, value = line.partition("=")
            if not eq or key in settings:
                raise ValueError(f"line {line!r} is not a key=value setting given once")
            settings[key] = value
        version = settings.get("version")
        if version not in (str(LIMITS_VERSION), str(SCHEDULED_VERSION)):
            raise ValueError(
                f"version={version!r}, expected {LIMITS_VERSION} or {SCHEDULED_VERSION}"
            )
        try:
            mem = tuple(int(v) for v in settings["mem_limit"].split(","))
            limits = cls(mem, int(settings["core_limit"]), settings["unit"], settings["broker"])
            if version == str(SCHEDULED_VERSION):
                limits = replace(
                    limits,
                    policy=int(settings["policy"]),
                    weight=int(settings["weight"]),
                    slot=settings["slot"],
                    sched_dir=settings["sched_dir"],
                    gpus=tuple(int(g) for g in settings["gpus"].split(",")),
                )
            if "uuids" in settings:
                limits = replace(limits, uuids=tuple(settings["uuids"].split(",")))
        except (KeyError, ValueError) as err:
            raise ValueError(f"not a limits file of version {LIMITS_VERSION}: {err}") from err
        limits.render()  # the same checks as when it was written
        return limits
