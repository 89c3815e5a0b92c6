"""What each container uses on its GPUs, beside what it was allocated: the metrics' source.

The accounting broker (``deviceplugin.broker``) counts every byte of GPU memory a container's
processes hold, on ``cgpu`` and ``core_mem`` nodes, but knows a container only by its account
key. An :class:`Owner` says whose the key is: the pod (``namespace/name``), the container, the
host GPU of each device ordinal, and the computing power it was given. Allocate knows all of it
for a container it can name; one named by its device IDs gets its pod and container when
PodResources names them (``InterposerIsolation.weigh``).

The owner is kept in a file beside the container's limits (``<state>/limits/<key>/owner``), so
a restarted plugin reports the same containers again. The limits file itself is mounted into
the container and read by the interposer, whose format has no room for a pod's name; the owner
file is not mounted anywhere, so the container never sees other pods' names either.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import msgspec

OWNER_FILE_NAME = "owner"


class Owner(msgspec.Struct, frozen=True):
    """Whose an account key is; ``pod`` is ``""`` until PodResources names it."""

    pod: str
    """``namespace/name``."""
    container: str
    gpus: tuple[int, ...]
    """The host GPU index of each device ordinal."""
    core_pct: int = 0
    """Computing power given on each GPU, percent (0: none asked, the whole GPU may be used)."""


@dataclass(frozen=True)
class ContainerUse:
    """One container's GPU memory, held now and allowed, per device ordinal."""

    owner: Owner
    used_bytes: tuple[int, ...]
    limit_bytes: tuple[int, ...]

    @property
    def namespace(self) -> str:
        return self.owner.pod.partition("/")[0]

    @property
    def pod_name(self) -> str:
        return self.owner.pod.partition("/")[2]


def write_owner(directory: Path, owner: Owner) -> None:
    """Write the owner file (atomically: a restart reads the old file or the new)."""
    tmp = directory / f".{OWNER_FILE_NAME}.tmp"
    tmp.write_bytes(msgspec.json.encode(owner))
    tmp.replace(directory / OWNER_FILE_NAME)


def read_owner(directory: Path) -> Owner | None:
    """The owner file's record, or None when there is none or it cannot be read."""
    try:
        return msgspec.json.decode((directory / OWNER_FILE_NAME).read_bytes(), type=Owner)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None
