"""What a GPU container sees of the hand-off, checked from inside it (``gpushare check-hand-off``).

The plugin's start check (``handoffproof``) asks the runtime what it would do; this asks the
container what it got, so it also catches what no setting shows (a spec naming other device
nodes, a runtime class not applied, a kubelet that never called Allocate). It compares the
variables the plugin's Allocate answer set with the files the container has:

- ``ALIYUN_COM_GPU_MEM_IDX`` names the GPUs placed; without it the plugin answered nothing for
  this container (it asks for no ``aliyun.com/gpu-mem``, or gpushare did not place it).
- one device node ``/dev/nvidia<N>`` per placed GPU, and no more (a GPU beyond the placement is
  another tenant's). The driver names a node by the GPU's minor number, which is its index on
  usual hosts: the nodes named by index are looked for first, and otherwise the count decides.
- ``/dev/nvidiactl``, which the NVIDIA stack adds with every GPU (the toolkit's CDI spec and its
  legacy hook alike); fake GPUs have no driver and so no control node, hence ``control``.
- ``/etc/gpushare/limits`` where the plugin isolated the container (it set
  ``GPUSHARE_MEM_LIMIT`` beside it).

The strategy is read from ``NVIDIA_VISIBLE_DEVICES``: ``void`` under ``cdi-cri``, the UUIDs
under ``envvar``. A failure names what is missing and the likely cause under that strategy.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpushare.core.admitting.isolationpaths import CONTAINER_LIMITS_FILE
from gpushare.node.cdi import VOID

CONTROL = "/dev/nvidiactl"
GPU_NODE = re.compile(r"^/dev/nvidia(\d+)$")


@dataclass(frozen=True)
class Seen:
    """The outcome: passed or not, with one line per finding."""

    ok: bool
    lines: tuple[str, ...]

    def text(self) -> str:
        """The report, one finding a line."""
        return "\n".join(self.lines)


def _minor(path: str) -> int:
    """The number of a ``/dev/nvidia<N>`` node."""
    found = GPU_NODE.match(path)
    return int(found.group(1)) if found else -1


def strategy_of(env: Mapping[str, str]) -> str:
    """The device-list strategy the answer's ``NVIDIA_VISIBLE_DEVICES`` shows."""
    visible = env.get("NVIDIA_VISIBLE_DEVICES", "")
    if visible == VOID:
        return "cdi-cri"
    if visible.startswith(("GPU-", "MIG-")):
        return "envvar"
    return "unknown"


CAUSES = {
    "cdi-cri": (
        "the runtime did not apply the CDI devices the plugin named: containerd with "
        "enable_cdi = false (the default of containerd 1.7), cdi_spec_dirs without the spec's "
        "directory, or a spec naming other device nodes. The device plugin's log has the line "
        "phase=hand-off-check saying what its runtime reported at start; turn CDI on, or set "
        "devicePlugin.deviceListStrategy=envvar"
    ),
    "envvar": (
        "the NVIDIA runtime did not act on NVIDIA_VISIBLE_DEVICES: it is not this pod's runtime "
        "(k3s, RKE2, OpenShift: set a runtimeClassName of nvidia for GPU pods, or make it the "
        "default), or its config.toml sets accept-nvidia-visible-devices-envvar-when-"
        "unprivileged = false (then use devicePlugin.deviceListStrategy=cdi-cri)"
    ),
    "unknown": (
        "the hand-off named no GPU this container's runtime applied; check the device plugin's "
        "devicePlugin.deviceListStrategy and its start log (phase=hand-off-check)"
    ),
}


def check(env: Mapping[str, str], present: Iterable[str], *, control: bool = True) -> Seen:
    """Compare what the plugin promised in ``env`` with the ``present`` paths."""
    have = set(present)
    indexes = [i for i in env.get("ALIYUN_COM_GPU_MEM_IDX", "").split(",") if i.strip()]
    if not indexes:
        return Seen(
            False,
            (
                "FAIL no ALIYUN_COM_GPU_MEM_IDX: the device plugin answered nothing for this "
                "container; ask for aliyun.com/gpu-mem and let gpushare's scheduler place the "
                "pod (schedulerName, or the steering webhook)",
            ),
        )
    strategy = strategy_of(env)
    missing: list[str] = []
    lines = [
        f"placed GPU(s) {','.join(indexes)}, {env.get('ALIYUN_COM_GPU_MEM_CONTAINER', '?')} "
        f"unit(s) of {env.get('GPUSHARE_MEM_UNIT', '?')} "
        f"(mode {env.get('GPUSHARE_MODE', '?')}, strategy {strategy})"
    ]
    nodes = sorted((p for p in have if GPU_NODE.match(p)), key=_minor)
    named = [f"/dev/nvidia{i.strip()}" for i in indexes]
    if all(n in have for n in named) and len(nodes) == len(named):
        lines.append(f"ok   device nodes {', '.join(named)}")
    elif len(nodes) == len(named):
        lines.append(f"ok   device nodes {', '.join(nodes)} (one per placed GPU)")
    elif len(nodes) < len(named):
        missing.append(
            f"FAIL {len(named)} GPU device node(s) expected ({', '.join(named)}), "
            f"{len(nodes)} found{': ' + ', '.join(nodes) if nodes else ''}"
        )
    else:
        missing.append(
            f"FAIL {len(nodes)} GPU device nodes ({', '.join(nodes)}) for {len(named)} placed "
            "GPU(s): this container sees GPUs it was not given (an image or pod setting "
            "NVIDIA_VISIBLE_DEVICES where the runtime honours it; docs/gpu-operator.md)"
        )
    if control:
        if CONTROL in have:
            lines.append(f"ok   {CONTROL}")
        else:
            missing.append(f"FAIL no {CONTROL} (the driver's control node comes with every GPU)")
    if "GPUSHARE_MEM_LIMIT" in env:
        if CONTAINER_LIMITS_FILE in have:
            lines.append(f"ok   {CONTAINER_LIMITS_FILE} (isolation)")
        else:
            missing.append(
                f"FAIL no {CONTAINER_LIMITS_FILE}, though the plugin isolated this container "
                "(GPUSHARE_MEM_LIMIT): the mount the plugin answered was not applied"
            )
    if not missing:
        return Seen(True, (*lines, "hand-off ok"))
    return Seen(False, (*lines, *missing, f"likely cause ({strategy}): {CAUSES[strategy]}"))
