"""The limits file: a container's GPU share, where the container cannot change it.

The device plugin gives the interposer each container's limits twice: as environment
variables (``GPUSHARE_MEM_LIMIT``, ``GPUSHARE_CORE_LIMIT``, ``GPUSHARE_ACCOUNTING_DIR``), which
people read and older interposers use, and as this file, written on the host under the state
directory and mounted read-only at :data:`CONTAINER_LIMITS_FILE`. Environment is the
container's own: kubelet puts the pod's ``env`` after the plugin's, and any process may change
it for the programs it starts. A read-only bind mount is not: an unprivileged container can
neither write it nor unmount it. So the interposer reads the file first, and the file wins.

The format is the interposer's (``native/interposer.c``, ``gs_parse_file``), version 1: lines
``key=value`` without spaces, ``#`` lines are comments, ``version=1`` first, then every one of
``mem_limit`` (bytes, one value for every visible GPU or one per GPU in order, as in
``GPUSHARE_MEM_LIMIT``), ``core_limit`` (SM percent, 0 for none), ``unit`` (the memory unit the
limit was counted in, for people) and ``accounting_dir``, each once; the file ends with a newline
(so a cut-short file is told from a whole one). Anything else makes the interposer refuse every
allocation: a file it cannot read is more likely damage or tampering than an intent to run
without limits.
"""

from __future__ import annotations

from dataclasses import dataclass

LIMITS_VERSION = 1
CONTAINER_LIMITS_FILE = "/etc/gpushare/limits"
"""Where containers see the file; compiled into the interposer (``GPUSHARE_LIMITS_FILE``)."""
LIMITS_FILE_NAME = "limits"


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
    """Per visible GPU, in the order of the container's device ordinals."""
    core_pct: int
    """SM percent of each GPU; 0 (or 100) means no throttle."""
    unit: str
    """The memory unit the limits were counted in (``1GiB``, ``128MiB``); for people."""
    accounting_dir: str
    """The container path of the usage table's directory."""

    def render(self) -> str:
        """The file's text, version 1."""
        if not 0 <= self.core_pct <= 100:
            raise ValueError(f"core_pct must be 0..100, got {self.core_pct}")
        if not self.accounting_dir.startswith("/"):
            raise ValueError(f"accounting_dir must be absolute, got {self.accounting_dir!r}")
        for name, value in (("unit", self.unit), ("accounting_dir", self.accounting_dir)):
            if not value or any(c <= " " or c >= "\x7f" for c in value):
                raise ValueError(f"{name}={value!r} must be non-empty printable ASCII, no spaces")
        return (
            "# gpushare: this container's GPU limits, written by the device plugin and read by\n"
            "# libgpushare-cuda.so; they win over GPUSHARE_* in the environment.\n"
            f"version={LIMITS_VERSION}\n"
            f"mem_limit={mem_limit_text(self.mem_limit_bytes)}\n"
            f"core_limit={self.core_pct}\n"
            f"unit={self.unit}\n"
            f"accounting_dir={self.accounting_dir}\n"
        )
