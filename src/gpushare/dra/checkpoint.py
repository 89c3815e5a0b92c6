"""The claims the driver prepared, kept on disk so a restarted driver can unprepare them.

kubelet calls ``NodePrepareResources`` again for a claim it already had prepared (after its own
restart, or when an answer was lost), and ``NodeUnprepareResources`` for a claim the driver may
have prepared before it restarted. So each prepared claim is written down with what kubelet was
answered (its devices and CDI names) and the CDI spec file that carries it: a second prepare
answers the same without reading the API again, and an unprepare after a restart still knows
which spec to remove.

The file is ``<state>/dra-prepared-<node>.json``, written atomically (a rename) after every
change, before kubelet is answered. An unreadable file starts empty, logged: the claims' spec
files are then found by name (``preparing.spec_file_name``) when kubelet unprepares them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpushare.dra.preparing import PreparedDevice
from gpushare.node.enforcement.library import write_atomically

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreparedClaim:
    """One prepared claim: who it is, what kubelet was answered, the spec that carries it."""

    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    spec_file: str

    def to_json(self) -> dict[str, Any]:
        """The file's form."""
        return {
            "namespace": self.namespace,
            "name": self.name,
            "devices": [d.to_json() for d in self.devices],
            "spec_file": self.spec_file,
        }

    @classmethod
    def from_json(cls, uid: str, data: dict[str, Any]) -> PreparedClaim:
        """Read the file's form back (KeyError, TypeError or ValueError when malformed)."""
        return cls(
            uid=uid,
            namespace=str(data["namespace"]),
            name=str(data["name"]),
            devices=tuple(PreparedDevice.from_json(d) for d in data["devices"]),
            spec_file=str(data["spec_file"]),
        )


class PreparedCheckpoint:
    """The prepared claims by UID, in memory and on disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._claims = self._load()

    def _load(self) -> dict[str, PreparedClaim]:
        try:
            raw = json.loads(self.path.read_text())
            return {uid: PreparedClaim.from_json(uid, data) for uid, data in raw.items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            log.warning("checkpoint=%s unreadable, starting empty: %s", self.path, err)
            return {}

    def _save(self) -> None:
        text = json.dumps({uid: c.to_json() for uid, c in sorted(self._claims.items())}, indent=1)
        write_atomically(self.path, text, 0o600)

    def get(self, uid: str) -> PreparedClaim | None:
        """The claim prepared under this UID, if any."""
        return self._claims.get(uid)

    def remember(self, claim: PreparedClaim) -> None:
        """Note a prepared claim (OSError when the file cannot be written)."""
        self._claims[claim.uid] = claim
        self._save()

    def forget(self, uid: str) -> None:
        """Drop a claim once unprepared (OSError when the file cannot be written)."""
        if self._claims.pop(uid, None) is not None:
            self._save()

    def __iter__(self) -> Iterator[PreparedClaim]:
        return iter(list(self._claims.values()))

    def uids(self) -> frozenset[str]:
        """The UIDs of every prepared claim."""
        return frozenset(self._claims)
