"""The runtime's check of the isolation mounts: a CDI device whose only edit is a hook.

Admission refuses a pod's volume at an isolation path (``core.admitting.tampering``), but it
compares paths as text and cannot see inside the image: where the image links ``/x/sched`` to
``/var/run/gpushare-sched``, a volume at ``/x/sched`` lands over the plugin's read-only
schedules, and one reached through a link to ``/etc`` hides the limits and the preload list. So
the check that counts is made where the tenant cannot reach, once every mount has landed: the
static program ``gpushare-mountcheck`` (``isolation/native/mountcheck.c``) runs as an OCI
``createRuntime`` hook, looks up each of the plugin's mounts inside the container's root the way
the container will, and refuses the container (its creation fails, with the reason in the pod's
events) when one is not the plugin's file, or not read-only, or something covers an entry of it.

How it reaches the container: the plugin writes a CDI spec of kind ``gpushare.io/isolation``
with one device, ``verify``, whose container edits are that hook, into a directory the runtime
reads specs from (``--cdi-hook-dir``, ``/var/run/cdi`` by default); every isolated container's
Allocate answer names the device beside its GPUs. A runtime that cannot find the spec refuses
the container rather than start it unchecked. The hook program is copied into the isolation
library directory on the host, and the spec names it by its host path. Under the ``envvar``
strategy there is no CDI to carry a hook, and the plugin says at start that the check is off.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from gpushare.isolation.build import MOUNTCHECK_NAME
from gpushare.node.enforcement.hook import ContainerAnswer
from gpushare.node.enforcement.library import packaged, write_atomically

log = logging.getLogger(__name__)

KIND = "gpushare.io/isolation"
NAME = "verify"
DEVICE = f"{KIND}={NAME}"
"""The CDI device each isolated container is given: the hook, nothing else."""
SPEC_NAME = "gpushare-isolation.json"
DEFAULT_SPEC_DIR = Path("/var/run/cdi")
CDI_VERSION = "0.5.0"
"""The least CDI version with everything the spec uses; containerd 2 and CRI-O read it."""
TIMEOUT_S = 10
"""The hook's time limit: it stats a few dozen files, well under a second."""


def packaged_mountcheck() -> Path | None:
    """The hook program built into this package, if the build produced it."""
    return packaged(MOUNTCHECK_NAME)


@dataclass(frozen=True)
class MountCheck:
    """Installs the hook and its CDI spec, and names it in isolated containers' answers."""

    spec_dir: Path
    """Where the runtime reads CDI specs from, writable by the plugin."""
    lib_dir: Path
    """The isolation library directory on the host: the hook program goes there."""
    watched: tuple[Path, ...]
    """Host directories whose mounts the hook checks: the plugin's state and library."""
    packaged: Path | None = None

    @property
    def program(self) -> Path:
        """The hook's host path, as the spec names it."""
        return self.lib_dir / MOUNTCHECK_NAME

    def spec(self) -> dict[str, object]:
        """The CDI spec: one device whose only edit is the createRuntime hook."""
        args = [MOUNTCHECK_NAME]
        for directory in self.watched:
            args += ["--under", str(directory)]
        hook = {
            "hookName": "createRuntime",
            "path": str(self.program),
            "args": args,
            "timeout": TIMEOUT_S,
        }
        return {
            "cdiVersion": CDI_VERSION,
            "kind": KIND,
            "devices": [{"name": NAME, "containerEdits": {"hooks": [hook]}}],
        }

    def install(self) -> str | None:
        """Copy the program and write the spec (each atomically); why it failed; None when done."""
        if self.packaged is None:
            return (
                f"the isolation check {MOUNTCHECK_NAME} is not in this gpushare package "
                f"(gpushare/isolation/native/{MOUNTCHECK_NAME}): build it (python -m "
                f"gpushare.isolation.build, or the image)"
            )
        try:
            self.lib_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.lib_dir / f".{MOUNTCHECK_NAME}.tmp"
            shutil.copyfile(self.packaged, tmp)
            tmp.chmod(0o755)
            tmp.replace(self.program)
        except OSError as err:
            return (
                f"cannot install {MOUNTCHECK_NAME} into --isolation-lib-dir {self.lib_dir}: {err}"
            )
        try:
            write_atomically(self.spec_dir / SPEC_NAME, json.dumps(self.spec(), indent=2), 0o644)
        except OSError as err:
            return (
                f"cannot write the isolation check's CDI spec into --cdi-hook-dir "
                f"{self.spec_dir}: {err}; it must be one of the container runtime's "
                f"cdi_spec_dirs, writable by the plugin (the chart mounts /var/run/cdi)"
            )
        log.info("cdi=%s hook=%s phase=mountcheck installed", DEVICE, self.program)
        return None

    def guard(self, answer: ContainerAnswer) -> ContainerAnswer:
        """Name the check's device in an answer that mounts the isolation; others unchanged."""
        if not answer.mounts or DEVICE in answer.cdi_devices:
            return answer
        return replace(answer, cdi_devices=(*answer.cdi_devices, DEVICE))
