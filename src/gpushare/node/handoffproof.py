"""Whether the node's container runtime applies the plugin's hand-off, decided at start.

A runtime that ignores the hand-off does not fail the container: under ``cdi-cri`` containerd
with CDI off drops the CDI names kubelet passes on, and under ``envvar`` an NVIDIA Container
Toolkit configured with ``accept-nvidia-visible-devices-envvar-when-unprivileged = false``
ignores the variable in every unprivileged container. Either way the tenant's pod runs, counted
as holding GPU memory, with no GPU in it, and nothing says so. The spec files the plugin reads
(``cdi.HandOff.refusal``) cannot tell; only the runtime's own setting can. So the plugin asks,
and this module decides from the answers, with no I/O:

- ``cdi-cri``: the CRI runtime's ``Status`` (verbose). containerd puts its CRI configuration in
  ``info["config"]`` as JSON, with ``enableCDI`` and ``cdiSpecDirs`` (the TOML keys
  ``enable_cdi`` and ``cdi_spec_dirs``): containerd v2.2.9 ``internal/cri/config/config.go``
  (``RuntimeConfig``, embedded in ``Config``, which ``internal/cri/server/status.go`` marshals);
  1.7 ``pkg/cri/config/config.go`` (``PluginConfig``, embedded the same way;
  ``pkg/cri/server/status.go``). The default is on in 2.x (``config_unix.go``) and off in 1.7;
  1.6 has no CDI and no such key. CRI-O reports no such setting, and a runtime that does not
  answer says nothing: the plugin cannot tell, says why, and starts.
- ``envvar``: the toolkit's ``config.toml`` (``/etc/nvidia-container-runtime/config.toml``),
  key ``accept-nvidia-visible-devices-envvar-when-unprivileged``, true when absent
  (nvidia-container-toolkit ``api/config/v1/config.go``, ``GetDefault``). Tenant containers are
  unprivileged, so false hands them nothing whatever the plugin's own privileges.
- any other strategy has nothing to prove here.

The outcome is a value with its reasons (:class:`Proof`); what to do with it is the
``--hand-off-check`` mode's (:func:`refusal`): ``refuse`` ends the start on
:attr:`Verdict.IGNORED`, ``warn`` only logs it, ``off`` never asks.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path, PurePosixPath

from gpushare.node.cdi import Strategy

TOOLKIT_CONFIG = Path("/etc/nvidia-container-runtime/config.toml")
"""Where the NVIDIA Container Toolkit reads its configuration on a host (``RelativeFilePath``
under ``/etc``)."""
ACCEPT_ENVVAR = "accept-nvidia-visible-devices-envvar-when-unprivileged"
CRI_SOCKET = Path("/run/containerd/containerd.sock")
"""containerd's default socket; k3s and RKE2: ``/run/k3s/containerd/containerd.sock``."""


class Mode(StrEnum):
    """``--hand-off-check``: what a proven-ignored hand-off does to the start."""

    REFUSE = "refuse"
    WARN = "warn"
    OFF = "off"


class Verdict(StrEnum):
    """What the node's runtime was found to do with the hand-off."""

    APPLIED = "applied"
    """The runtime's own setting says it applies the hand-off."""
    IGNORED = "ignored"
    """The runtime's own setting says it drops the hand-off: pods would run without GPUs."""
    UNKNOWN = "unknown"
    """The runtime could not be asked, or does not say; the reasons say why."""
    SKIPPED = "skipped"
    """Not asked: ``--hand-off-check off``, or a strategy with nothing to prove."""


@dataclass(frozen=True)
class Proof:
    """The verdict and why, in words a log line and a refusal can carry."""

    verdict: Verdict
    reasons: tuple[str, ...]

    def summary(self) -> str:
        """One line: the verdict and the reasons."""
        return f"{self.verdict.value}: {'; '.join(self.reasons)}"


@dataclass(frozen=True)
class RuntimeAnswer:
    """What the CRI runtime said (``Version`` and verbose ``Status``), or why it said nothing."""

    name: str = ""
    version: str = ""
    info: Mapping[str, str] | None = None
    """``StatusResponse.info``; None when the runtime was not asked or did not answer."""
    unanswered: str = ""
    """Why there is no answer (socket absent, refused, timed out); empty when there is one."""


@dataclass(frozen=True)
class ToolkitAnswer:
    """What the NVIDIA Container Toolkit's configuration file says, or why it was not read."""

    path: Path
    text: str | None = None
    """The file's content; None when it could not be read."""
    unread: str = ""
    """Why it could not be read (not mounted, no such file); empty when it was."""

    @classmethod
    def read(cls, path: Path) -> ToolkitAnswer:
        """Read the file (the module's one read; a missing file is an answer too)."""
        try:
            return cls(path, text=path.read_text())
        except FileNotFoundError:
            return cls(
                path,
                unread="no such file here (the chart mounts the host's toolkit configuration "
                "read-only under devicePlugin.deviceListStrategy=envvar)",
            )
        except (OSError, UnicodeDecodeError) as err:
            return cls(path, unread=f"{type(err).__name__}: {err}")


def _same_dir(path: str) -> str:
    """A directory as the runtime and the plugin may both write it: ``/var/run`` is ``/run``."""
    posix = PurePosixPath(path)
    parts = posix.parts
    if parts[:3] == ("/", "var", "run"):
        posix = PurePosixPath("/run", *parts[3:])
    return str(posix)


def prove_cdi(
    answer: RuntimeAnswer, *, spec_files: Sequence[str], spec_dirs: Sequence[Path]
) -> Proof:
    """Whether the CRI runtime applies CDI and reads the directory of the plugin's spec."""
    who = " ".join(p for p in (answer.name, answer.version) if p) or "the container runtime"
    if answer.info is None:
        return Proof(Verdict.UNKNOWN, (f"cannot tell: {answer.unanswered or 'no answer'}",))
    if answer.name and answer.name != "containerd":
        return Proof(
            Verdict.UNKNOWN,
            (
                f"cannot tell: {who} reports no CDI setting through CRI (only containerd's "
                "is read); make sure it applies CDI devices from the node's spec directories",
            ),
        )
    try:
        config = json.loads(answer.info.get("config", ""))
    except ValueError:
        config = None
    if not isinstance(config, dict):
        return Proof(
            Verdict.UNKNOWN,
            (f"cannot tell: {who} gave no CRI configuration in its verbose Status",),
        )
    if "enableCDI" not in config:
        return Proof(
            Verdict.IGNORED,
            (
                f"{who} has no CDI support (its CRI configuration has no enableCDI; containerd "
                "applies CDI from 1.7 on)",
            ),
        )
    if config["enableCDI"] is not True:
        return Proof(Verdict.IGNORED, (f"{who} runs with enable_cdi = false",))
    read = config.get("cdiSpecDirs")
    if not isinstance(read, list):
        return Proof(
            Verdict.APPLIED, (f"{who}: enable_cdi = true (its spec directories not reported)",)
        )
    theirs = {_same_dir(str(d)) for d in read}
    ours = sorted({str(PurePosixPath(f).parent) for f in spec_files}) or [str(d) for d in spec_dirs]
    unread = [d for d in ours if _same_dir(d) not in theirs]
    said = f"{who}: enable_cdi = true, cdi_spec_dirs = {', '.join(str(d) for d in read)}"
    if len(unread) == len(ours):
        what = "the plugin's CDI spec is in" if spec_files else "the plugin reads CDI specs from"
        return Proof(
            Verdict.IGNORED,
            (f"{said}, but {what} {', '.join(unread)}, which the runtime does not read",),
        )
    return Proof(Verdict.APPLIED, (said,))


def prove_envvar(answer: ToolkitAnswer) -> Proof:
    """Whether the NVIDIA Container Toolkit honours ``NVIDIA_VISIBLE_DEVICES`` in tenants."""
    if answer.text is None:
        return Proof(
            Verdict.UNKNOWN,
            (f"cannot tell: the NVIDIA Container Toolkit's {answer.path}: {answer.unread}",),
        )
    try:
        config = tomllib.loads(answer.text)
    except tomllib.TOMLDecodeError as err:
        return Proof(Verdict.UNKNOWN, (f"cannot tell: {answer.path} is not TOML ({err})",))
    value = config.get(ACCEPT_ENVVAR, True)
    if value is False:
        return Proof(Verdict.IGNORED, (f"{answer.path} sets {ACCEPT_ENVVAR} = false",))
    if value is not True:
        return Proof(
            Verdict.UNKNOWN, (f"cannot tell: {answer.path} sets {ACCEPT_ENVVAR} = {value!r}",)
        )
    given = ACCEPT_ENVVAR in config
    return Proof(
        Verdict.APPLIED,
        (f"{answer.path}: {ACCEPT_ENVVAR} = true{'' if given else ' (the default)'}",),
    )


def skipped(strategy: Strategy | str, mode: Mode) -> Proof | None:
    """The proof when nothing is to be asked; None when the strategy's runtime must be asked."""
    if mode is Mode.OFF:
        return Proof(Verdict.SKIPPED, ("--hand-off-check off",))
    if strategy not in (Strategy.CDI_CRI, Strategy.ENVVAR):
        return Proof(Verdict.SKIPPED, (f"device-list strategy {strategy}: nothing to prove",))
    return None


def on_host(files: Sequence[str], seen: Sequence[Path], host: Sequence[Path]) -> list[str]:
    """The spec files as the host names them: each file's directory, one of ``seen`` (where
    the plugin reads it), replaced by the host directory in the same place of ``host``."""
    mapping = {str(s): str(h) for s, h in zip(seen, host, strict=False)}
    named = []
    for file in files:
        path = PurePosixPath(file)
        named.append(str(PurePosixPath(mapping.get(str(path.parent), str(path.parent)), path.name)))
    return named


def refusal(proof: Proof, strategy: Strategy) -> str | None:
    """The words a proven-ignored hand-off refuses (or warns) with; None for any other verdict."""
    if proof.verdict is not Verdict.IGNORED:
        return None
    why = "; ".join(proof.reasons)
    lost = "so this node's GPU pods would start without their GPUs"
    if strategy is Strategy.CDI_CRI:
        return (
            f"device-list strategy cdi-cri, but the container runtime ignores CDI devices "
            f"({why}), {lost}. Turn CDI on in containerd: "
            "enable_cdi = true and cdi_spec_dirs naming the spec's directory, under "
            "[plugins.'io.containerd.cri.v1.runtime'] (containerd 2) or "
            '[plugins."io.containerd.grpc.v1.cri"] (1.7; k3s/RKE2: config.toml.tmpl), then '
            "restart containerd; or hand GPUs over by variable instead: the chart's "
            "devicePlugin.deviceListStrategy=envvar (--device-list-strategy envvar). "
            "devicePlugin.handOffCheck=warn starts anyway"
        )
    return (
        f"device-list strategy envvar, but the NVIDIA Container Toolkit ignores "
        f"NVIDIA_VISIBLE_DEVICES in unprivileged containers ({why}), {lost}. Use CDI instead: "
        "devicePlugin.deviceListStrategy=cdi-cri with the toolkit's CDI spec (and "
        "devicePlugin.privileged=true, so the plugin itself still reads NVML), or set "
        f"{ACCEPT_ENVVAR} = true in the toolkit's config.toml. "
        "devicePlugin.handOffCheck=warn starts anyway"
    )
