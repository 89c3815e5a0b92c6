"""What Allocate served, per device-ID set, kept on disk so a restart of the plugin loses nothing.

kubelet names a container's devices in ``Allocate`` and later reports them per container through
PodResources; the served-check (reconcile.py) compares what was served for those IDs with where
the pod was placed. kubelet's device IDs are unique among live containers, except that a
container after an ordinary init container reuses the init container's IDs: the later answer
then replaces the earlier, which is the one PodResources will report.

The file is ``<state>/served-<node>.json``, written atomically (a rename) after every answer.
An unreadable file starts empty: the check then treats those containers as unknown, not wrong.
"""

from __future__ import annotations

import logging
from pathlib import Path

import msgspec

from gpushare.core.records.handoff import Signature

log = logging.getLogger(__name__)

_decode = msgspec.json.Decoder(dict[str, Signature]).decode
"""The whole file; a field of the wrong type anywhere fails it, naming the path."""


def _key(device_ids: list[str]) -> str:
    return ",".join(sorted(device_ids))


class ServedCheckpoint:
    """Signatures served, by sorted device IDs; loaded when made, saved on each change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._served: dict[str, Signature] = self._load()

    def _load(self) -> dict[str, Signature]:
        try:
            return _decode(self.path.read_bytes())
        except FileNotFoundError:
            return {}
        except OSError as err:
            log.warning("cannot read the checkpoint %s (%s): starting empty", self.path, err)
        except (msgspec.ValidationError, msgspec.DecodeError) as err:
            # "Expected `int`, got `str` - at `$[...].count`": the file was not written by this
            # version, or was damaged; its containers are then unknown to the check, not wrong
            log.warning("checkpoint %s is unreadable (%s): starting empty", self.path, err)
        return {}

    def remember(self, device_ids: list[str], signature: Signature) -> None:
        """Record an answer; a failed write is logged, the answer stands."""
        self._served[_key(device_ids)] = signature
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_bytes(msgspec.json.encode(self._served))
            tmp.replace(self.path)
        except OSError as err:
            log.warning("cannot write the checkpoint %s: %s", self.path, err)

    def signature(self, device_ids: list[str]) -> Signature | None:
        """What Allocate answered for exactly these device IDs, if it did."""
        return self._served.get(_key(device_ids))
