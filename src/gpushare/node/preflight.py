"""Whether the plugin may start on this node, decided before it publishes or serves anything.

Seven things refuse a start, each with the reason and what to do: kubelet running the static CPU
manager policy (the seeds' limit; checked by the CLI from kubelet's files), a node labelled with
a mode gpushare does not share GPUs in, a node labelled for DRA mode (the DRA driver serves it,
``refuse_dra_node``), another device plugin already handing out the node's GPUs (an
``nvidia.com/`` resource the node's status offers: NVIDIA's k8s-device-plugin, the GPU
Operator's, HAMi's), a memory unit that differs from the node's published one while pods still
hold memory counted in it (the scheduler's ledger would mix units), an isolation hook that
cannot serve the node's mode, and under the ``cdi-cri`` hand-off a GPU the node's CDI specs do
not name (the plugin checks that itself, ``cdi.HandOff.refusal``). The node's mode
(``ack.node.gpu.schedule``) also decides what is served: memory always, computing power on
``core_mem`` nodes.

The chart keeps the plugin off other nodes already: its DaemonSet's node affinity asks for the
label with one of ``devicePlugin.nodeModes`` (share, cgpu, core_mem and mps by default). A
plugin that still lands on a node labelled otherwise (``nodeModes`` widened, or the plugin run
by hand) would serve memory the scheduler never places there, since the core reads any other
value as "not shared"; it refuses instead. A node without the label is served as ``share``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpushare.core.booking.unitchange import refuse_unit_change
from gpushare.core.model.inventory import SHARED_MODES, Mode
from gpushare.core.model.kubejson import KubeObject, labels_of, name_of
from gpushare.core.model.names import (
    ALLOCATION_MODE_DEVICE_PLUGIN,
    ALLOCATION_MODE_DRA,
    LABEL_ALLOCATION_MODE,
    LABEL_MODE,
    ResourceNames,
)
from gpushare.core.model.platform import plugin_switch
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.handoff import CORE, MEM
from gpushare.node.enforcement.hook import IsolationHook


class StartRefused(Exception):
    """The plugin must not start; the message says why and what to do."""


@dataclass(frozen=True)
class Preflight:
    """The node's mode, and the reason not to start (None to start)."""

    mode: Mode
    refused: str | None = None

    @property
    def resources(self) -> list[str]:
        """What to serve: memory, and computing power on core_mem nodes."""
        return [MEM, CORE] if self.mode is Mode.CORE_MEM else [MEM]


def node_mode(node: KubeObject) -> Preflight:
    """The node's mode from its label (``share`` when it has none); refused when not shared."""
    label = labels_of(node).get(LABEL_MODE)
    if label is None:
        return Preflight(Mode.SHARE)
    mode = Mode.from_label(label)
    if mode is not Mode.NONE:
        return Preflight(mode)
    allowed = ", ".join(m.value for m in SHARED_MODES)
    return Preflight(
        mode,
        f"node {name_of(node)} has label {LABEL_MODE}={label!r}, which is not a mode gpushare "
        f"shares GPUs in (allowed: {allowed}), so the scheduler places no GPU memory here: "
        f"label the node with one of them (kubectl label node {name_of(node)} --overwrite "
        f"{LABEL_MODE}={Mode.SHARE.value}), or keep the device plugin off it (the chart's "
        f"devicePlugin.nodeModes)",
    )


def preflight(
    node: KubeObject,
    pods: Sequence[KubeObject],
    *,
    unit: MemoryUnit,
    names: ResourceNames,
    hook: IsolationHook,
) -> Preflight:
    """Check the mode, the unit against the pods holding memory, then let the hook prepare."""
    checked = node_mode(node)
    if checked.refused is not None:
        return checked
    reason = (
        refuse_dra_node(node)
        or refuse_other_plugin(node)
        or refuse_unit_change(node, pods, unit, names=names)
    )
    if reason is not None:
        return Preflight(checked.mode, reason)
    return Preflight(checked.mode, hook.prepare(checked.mode))


def refuse_dra_node(node: KubeObject) -> str | None:
    """Why the device plugin must not serve a node labelled for DRA mode; None when it may.

    A node is in one mode (docs/dra.md): there the DRA driver publishes the GPUs in a
    ResourceSlice and hands them out through claims, and a device plugin beside it would hand
    out the same GPUs to pods asking ``aliyun.com/gpu-mem``, each blind to the other's.
    """
    if labels_of(node).get(LABEL_ALLOCATION_MODE) != ALLOCATION_MODE_DRA:
        return None
    name = name_of(node)
    return (
        f"node {name} has {LABEL_ALLOCATION_MODE}={ALLOCATION_MODE_DRA}: the DRA driver "
        f"(gpushare dra-driver) serves its GPUs, and the device plugin would hand out the same "
        f"GPUs beside it. Keep the device plugin off DRA nodes (the chart's node affinity does), "
        f"or put the node back in device-plugin mode after draining its GPU pods (kubectl label "
        f"node {name} --overwrite {LABEL_ALLOCATION_MODE}={ALLOCATION_MODE_DEVICE_PLUGIN})"
    )


OTHER_PLUGIN_PREFIX = "nvidia.com/"
"""Resources of the device plugins that hand out whole NVIDIA GPUs or their MIG slices."""


def refuse_other_plugin(node: KubeObject) -> str | None:
    """Why the plugin must not serve a node whose GPUs another plugin hands out; None when
    none does.

    Two plugins on one node each hand out the same GPUs, each blind to the other's pods: a
    container of theirs lands on a GPU gpushare thinks is shared, or takes it whole. kubelet
    offers a resource as allocatable only while its plugin is registered and its devices healthy
    (it drops to 0 when the plugin goes), so a non-zero allocatable is a plugin serving now.
    The message names the switch of the node's platform (``core.model.platform``).
    """
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    serving = {
        k: v
        for k, v in allocatable.items()
        if isinstance(k, str)
        and k.startswith(OTHER_PLUGIN_PREFIX)
        and str(v).strip() not in ("0", "")
    }
    if not serving:
        return None
    offered = ", ".join(f"{k}={v}" for k, v in sorted(serving.items()))
    node_name = name_of(node)
    return (
        f"node {node_name} already offers {offered} from another device plugin (NVIDIA's "
        f"k8s-device-plugin, the GPU Operator's, the platform's own or HAMi's): two plugins "
        f"would hand out the same GPUs, each blind to the other's pods. Keep that plugin off "
        f"this node. {plugin_switch(node)}. kubelet stops offering its resource as soon as it is "
        f'gone, and this plugin starts on its next restart (docs/device-plugin.md, "Beside '
        f'another plugin")'
    )


def refuse_exclusive_cpus(cpu_ids: Sequence[int]) -> str | None:
    """Why the plugin must not start, from kubelet's PodResources ``GetAllocatableResources``;
    None when it may.

    The CPUs kubelet may hand out exclusively are none under the CPU manager's none policy
    (``nonePolicy.GetAllocatableCPUs`` returns an empty set) and the non-reserved ones under
    static: any CPU there is the static policy, on every distribution, through the socket the
    plugin already has, with no kubelet file to find (EKS, GKE, k3s and RKE2 keep theirs
    elsewhere, or none).
    """
    if not cpu_ids:
        return None
    return (
        f"kubelet runs the static CPU manager policy (PodResources offers {len(cpu_ids)} CPU(s) "
        f"for exclusive use); shared GPU scheduling does not support it: set cpuManagerPolicy: "
        f"none on this node (then remove kubelet's cpu_manager_state and restart kubelet, as "
        f"the Kubernetes documentation says for a policy change)"
    )


def refuse_static_cpu_policy(kubelet_config: Path, cpu_manager_state: Path) -> str | None:
    """Why the plugin must not start (kubelet runs the static CPU policy); None when it may.

    From kubelet's files, where they are (kubeadm's paths by default; the command skips a file
    that is not there). The plugin also asks kubelet itself (:func:`refuse_exclusive_cpus`).
    """
    for path, key in ((kubelet_config, "cpuManagerPolicy"), (cpu_manager_state, "policyName")):
        try:
            text = path.read_text()
        except OSError:
            continue
        try:
            data = yaml.safe_load(text)  # JSON (cpu_manager_state) is YAML too
        except yaml.YAMLError:
            continue
        if isinstance(data, dict) and str(data.get(key, "")).lower() == "static":
            return (
                f"kubelet runs {key}: static ({path}); shared GPU scheduling does not support "
                f"the static CPU manager policy: set cpuManagerPolicy: none on this node"
            )
    return None
