"""The limits file: a container's GPU share, where the container cannot change it.

The device plugin gives the interposer each container's limits twice: as environment
variables (``GPUSHARE_MEM_LIMIT``, ``GPUSHARE_CORE_LIMIT``), which people read, and as this
file, written on the host under the state directory and mounted read-only at
:data:`CONTAINER_LIMITS_FILE`. Environment is the container's own: kubelet puts the pod's
``env`` after the plugin's, and any process may change it for the programs it starts. A
read-only bind mount is not: an unprivileged container can neither write it nor unmount it. So
the interposer reads the file first, and the file wins.

The format is the interposer's (``native/interposer.c``, ``gs_parse_file``), version 2: lines
``key=value`` without spaces, ``#`` lines are comments, ``version=2`` first, then every one of
``mem_limit`` (bytes, one value for every visible GPU or one per GPU in order, as in
``GPUSHARE_MEM_LIMIT``), ``core_limit`` (SM percent, 0 for none), ``unit`` (the memory unit the
limit was counted in, for people) and ``broker`` (the container path of the accounting broker's
socket, ``gpushare.isolation.accounting``), each once; the file ends with a newline (so a
cut-short file is told from a whole one). Anything else makes the interposer refuse every
allocation: a file it cannot read is more likely damage or tampering than an intent to run
without limits. The interposer still reads version 1, which named ``accounting_dir``, a usage
table the container itself wrote; the plugin no longer writes it.
"""

from __future__ import annotations

from dataclasses import dataclass

LIMITS_VERSION = 2
CONTAINER_LIMITS_FILE = "/etc/gpushare/limits"
"""Where containers see the file; compiled into the interposer (``GPUSHARE_LIMITS_FILE``)."""
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
    """Per visible GPU, in the order of the container's device ordinals."""
    core_pct: int
    """SM percent of each GPU; 0 (or 100) means no throttle."""
    unit: str
    """The memory unit the limits were counted in (``1GiB``, ``128MiB``); for people."""
    broker: str
    """The container path of the accounting broker's socket."""

    def render(self) -> str:
        """The file's text, version 1."""
        if not 0 <= self.core_pct <= 100:
            raise ValueError(f"core_pct must be 0..100, got {self.core_pct}")
        if not self.broker.startswith("/") or len(self.broker.encode()) > MAX_SOCKET_PATH:
            raise ValueError(
                f"broker must be an absolute path of at most {MAX_SOCKET_PATH} bytes, "
                f"got {self.broker!r}"
            )
        for name, value in (("unit", self.unit), ("broker", self.broker)):
            if not value or any(c <= " " or c >= "\x7f" for c in value):
                raise ValueError(f"{name}={value!r} must be non-empty printable ASCII, no spaces")
        return (
            "# gpushare: this container's GPU limits, written by the device plugin and read by\n"
            "# libgpushare-cuda.so; they win over GPUSHARE_* in the environment.\n"
            f"version={LIMITS_VERSION}\n"
            f"mem_limit={mem_limit_text(self.mem_limit_bytes)}\n"
            f"core_limit={self.core_pct}\n"
            f"unit={self.unit}\n"
            f"broker={self.broker}\n"
        )

    @classmethod
    def parse(cls, text: str) -> ContainerLimits:
        """Read back a version 2 file as :meth:`render` writes it; ValueError says what is wrong.

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
        if settings.get("version") != str(LIMITS_VERSION):
            raise ValueError(f"version={settings.get('version')!r}, expected {LIMITS_VERSION}")
        try:
            mem = tuple(int(v) for v in settings["mem_limit"].split(","))
            limits = cls(mem, int(settings["core_limit"]), settings["unit"], settings["broker"])
        except (KeyError, ValueError) as err:
            raise ValueError(f"not a limits file of version {LIMITS_VERSION}: {err}") from err
        limits.render()  # the same checks as when it was written
        return limits
