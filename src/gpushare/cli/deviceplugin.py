"""``gpushare device-plugin``: kubelet's device plugin for one node's shared GPUs.

The composition root, in three steps. The flags become one validated value
(``cli.pluginoptions.PluginOptions``: the cGPU policy and pods per GPU, flags or the chart's
environment; the hand-off; the broker's caps; a fake topology without fake GPUs; the scheduling
settings). :func:`build_plugin` then checks what only the node can say, in this order, and
refuses with the reason: the seal key, kubelet's CPU manager policy (read from kubelet's files),
the GPUs (NVML, or fakes for tests) and the API client; and wires the plugin, its isolation hook
and its counters. :func:`run_plugin` serves the metrics and health ports and runs the plugin. The
plugin's own preflight (``node.preflight``: the node's mode label, a unit change under pods, the
isolation hook) refuses from inside the running plugin and ends the command the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import click

from gpushare.cli.errors import CommandError
from gpushare.cli.logs import log_format_option, log_level_option, setup_logging
from gpushare.cli.options import node_driver_options, resource_name_options
from gpushare.cli.scrapeaccess import metrics_access, metrics_access_options
from gpushare.cli.sealing import seal_options, trust_from_flags
from gpushare.core.model.startuptaint import STARTUP_TAINT

if TYPE_CHECKING:
    from gpushare.cli.pluginoptions import PluginOptions
    from gpushare.deviceplugin.plugin import DevicePlugin
    from gpushare.kube.lightkube_api import LightkubeAPI
    from gpushare.kube.port import KubeAPI
    from gpushare.node.enforcement.nodehook import NodeIsolation
    from gpushare.node.gpus import GpuSource
    from gpushare.node.handoffproof import Proof

NVML_HINT = (
    "is the NVIDIA driver installed, and does this container see /dev/nvidiactl, "
    "/dev/nvidia<N> and libnvidia-ml.so.1? The chart gets them from the NVIDIA "
    "container runtime (NVIDIA_VISIBLE_DEVICES=all; set devicePlugin.runtimeClassName "
    "where it is not the node's default runtime). Nodes without the NVIDIA runtime (GKE's "
    "Container-Optimized OS) keep the driver in a host directory: set the chart's "
    "devicePlugin.deviceListStrategy=driver-root and devicePlugin.driverRoot.hostPath "
    "(--driver-root). For tests use --fake-gpus"
)


@click.command("device-plugin")
@node_driver_options(
    state_dir_help="Checkpoint, limits files, accounting broker sockets and MPS pipes; the same "
    "path as on the host.",
    strategy_help="How Allocate hands the placed GPUs over: cdi-cri (CDI devices KIND=<uuid>, "
    "which the node's CDI spec must name; NVIDIA_VISIBLE_DEVICES=void), envvar "
    "(NVIDIA_VISIBLE_DEVICES=<uuids>, for nodes without CDI) or driver-root (device nodes and "
    "the --driver-root directory, for nodes without the NVIDIA runtime, as GKE's "
    "Container-Optimized OS). docs/gpu-operator.md, docs/driver-root.md.",
    health_help="Serve /healthz and /readyz on 127.0.0.1 at this port (0 disables): /readyz "
    "answers 503 with the reason until the plugin has registered, and while the API server "
    "refuses its pod watch (the chart's readiness probe reads it).",
)
@click.option(
    "--fake-topology",
    default="",
    help="With --fake-gpus: how they are connected, published as gpushare.io/gpu-topology: "
    "nvswitch, nvlink-pairs, nvlink-islands, pcie, or a distance matrix such as 0,1;1,0 "
    "(docs/topology.md). Empty: none.",
)
@click.option("--gpu-memory-unit", default="1GiB", show_default=True)
@click.option("--device-plugin-dir", default="/var/lib/kubelet/device-plugins", show_default=True)
@click.option(
    "--pod-resources-socket",
    default="/var/lib/kubelet/pod-resources/kubelet.sock",
    show_default=True,
)
@click.option(
    "--broker-max-connections-per-pod",
    type=int,
    default=2048,
    show_default=True,
    help="cgpu/core_mem nodes: accounting-broker connections all containers of one pod may hold "
    "together (each container may hold 1024); more are answered with an error and closed.",
)
@click.option(
    "--broker-max-connections-per-node",
    type=int,
    default=16384,
    show_default=True,
    help="Accounting-broker connections the whole node may hold; never more than the plugin's "
    "open-file limit leaves after the 256 descriptors it keeps for its own work.",
)
@click.option(
    "--broker-min-connections-per-container",
    type=int,
    default=16,
    show_default=True,
    help="Accounting-broker connections every container can always open, whatever other "
    "containers hold: the pod and node caps bound only what a container takes beyond them.",
)
@click.option(
    "--broker-idle-timeout",
    type=float,
    default=60.0,
    show_default=True,
    help="Seconds a broker connection holding no memory may stay silent before it is closed "
    "(the interposer reconnects when it next asks); 0: never.",
)
@click.option(
    "--cdi-hook-dir",
    default="/var/run/cdi",
    show_default=True,
    help="cdi-cri: where the plugin writes the CDI spec of its isolation check, a hook that "
    "refuses a container whose isolation mounts a volume or an image link moved; one of the "
    "runtime's cdi_spec_dirs, writable. docs/isolation.md.",
)
@click.option(
    "--cdi-spec-host-dirs",
    default="",
    help="cdi-cri: the --cdi-spec-dirs as the host names them, same order, comma-separated, "
    "where the plugin sees them elsewhere (the chart mounts them under /host/cdi); empty: the "
    "same paths. The hand-off check compares them with the runtime's cdi_spec_dirs.",
)
@click.option(
    "--hand-off-check",
    type=click.Choice(["refuse", "warn", "off"]),
    default="refuse",
    show_default=True,
    help="At start, ask the runtime whether it applies the hand-off (cdi-cri: containerd's "
    "enable_cdi and cdi_spec_dirs through --cri-socket; envvar: the NVIDIA Container Toolkit's "
    "--toolkit-config). refuse: do not start where it does not; warn: log it and start; off: "
    "do not ask. A runtime that cannot be asked is logged as 'cannot tell', never refused.",
)
@click.option(
    "--cri-socket",
    default="/run/containerd/containerd.sock",
    show_default=True,
    help="cdi-cri: the container runtime's CRI socket, asked for its CDI settings "
    "(k3s and RKE2: /run/k3s/containerd/containerd.sock).",
)
@click.option(
    "--toolkit-config",
    default="/etc/nvidia-container-runtime/config.toml",
    show_default=True,
    help="envvar: the NVIDIA Container Toolkit's config.toml, read for "
    "accept-nvidia-visible-devices-envvar-when-unprivileged.",
)
@click.option("--kubelet-config", default="/var/lib/kubelet/config.yaml", show_default=True)
@click.option(
    "--cpu-manager-state", default="/var/lib/kubelet/cpu_manager_state", show_default=True
)
@log_level_option
@log_format_option
@click.option(
    "--metrics-port",
    type=int,
    default=9400,
    show_default=True,
    help="Serve Prometheus /metrics on this port (0 disables).",
)
@metrics_access_options
@click.option(
    "--used-summary-interval",
    type=click.FloatRange(min=0),
    default=300.0,
    show_default=True,
    help="Seconds between checks of the GPU memory in use that cgpu and core_mem nodes "
    "publish as the node annotation gpushare.io/gpu-used (written only when a GPU's use moved "
    "by a memory unit; kubectl inspect cgpu -d shows it); 0 never writes it.",
)
@click.option(
    "--startup-taint",
    default=STARTUP_TAINT,
    show_default=True,
    help="Remove this taint (any effect) from the node once kubelet allocates its GPU memory, "
    "so an autoscaler counts a new node as starting until then instead of adding another "
    "(docs/device-plugin.md); the node pool puts it on new nodes. Empty: none.",
)
@resource_name_options
@seal_options
def device_plugin(**flags: Any) -> None:
    """Serve kubelet's device plugin API for this node's shared GPUs."""
    from gpushare.cli.pluginoptions import PluginOptions

    options = PluginOptions.from_flags(flags)
    setup_logging(options.log_level, options.log_format)
    run_plugin(build_plugin(options))


@dataclass(frozen=True)
class Wired:
    """The device plugin as built for this node, with the parts its servers read."""

    options: PluginOptions
    plugin: DevicePlugin
    hook: NodeIsolation
    source: GpuSource
    api: KubeAPI


def build_plugin(options: PluginOptions) -> Wired:
    """Check what only the node can say, then wire the plugin; a CommandError says why not."""
    from gpushare.deviceplugin.config import PluginConfig, Stats
    from gpushare.deviceplugin.plugin import DevicePlugin
    from gpushare.node.cdi import Strategy
    from gpushare.node.descriptors import RESERVED
    from gpushare.node.enforcement.library import packaged_library
    from gpushare.node.enforcement.mountcheck import MountCheck, packaged_mountcheck
    from gpushare.node.enforcement.nodehook import NodeIsolation
    from gpushare.node.gpus import FakeGpus, NvmlGpus
    from gpushare.node.hostpaths import refuse_lib_dir, refuse_state_dir
    from gpushare.node.preflight import refuse_static_cpu_policy

    trust = trust_from_flags(options.seal_key_file, options.insecure_no_seal)
    reason = refuse_static_cpu_policy(options.kubelet_config, options.cpu_manager_state)
    reason = reason or refuse_state_dir(options.state_dir)
    if options.isolation != "none":
        reason = reason or refuse_lib_dir(options.isolation_lib_dir)
    if reason is not None:
        raise CommandError(reason)
    proof = prove_hand_off(options)
    source, api = open_node(
        f"gpushare device plugin on {options.node}",
        gpus=(
            partial(
                FakeGpus.parse,
                options.fake_gpus,
                node=options.node,
                health_file=options.fake_health_file,
                topology=options.fake_topology,
            )
            if options.fake_gpus
            else partial(NvmlGpus, options.handoff.driver_root)
        ),
        kubeconfig=options.kubeconfig,
        hint=NVML_HINT,
    )
    caps, settings = options.caps, options.settings
    click.echo(
        f"accounting broker: at most {caps.per_pod} connections per pod, "
        f"{caps.room(listeners=0)} per node, {caps.kept} kept for each container "
        f"(open-file limit {caps.descriptors or 'unlimited'}, "
        f"{RESERVED} kept for the plugin's own work)",
        err=True,
    )
    config = PluginConfig(
        node=options.node,
        plugin_dir=options.plugin_dir,
        pod_resources_socket=options.pod_resources_socket,
        state_dir=options.state_dir,
        unit=settings.unit,
        max_pods_per_gpu=settings.max_pods_per_gpu,
        names=settings.names,
        handoff=options.handoff,
        startup_taint=options.startup_taint,
    )
    stats = Stats()
    hook = NodeIsolation(
        caps=caps,
        broker_stats=stats.broker,
        cgpu_policy=options.cgpu_policy,
        max_pods=options.max_pods,
        policy=options.isolation,
        lib_dir=options.isolation_lib_dir,
        state_dir=options.state_dir,
        unit=settings.unit,
        source=source,
        packaged=packaged_library(),
        mount_check=(
            MountCheck(
                spec_dir=options.cdi_hook_dir,
                lib_dir=options.isolation_lib_dir,
                watched=(options.state_dir, options.isolation_lib_dir),
                packaged=packaged_mountcheck(),
            )
            if options.handoff.strategy is Strategy.CDI_CRI
            else None
        ),
    )
    stats.hand_off = proof.verdict.value
    plugin = DevicePlugin(
        api=api, source=source, config=config, hook=hook, trust=trust, stats=stats
    )
    return Wired(options=options, plugin=plugin, hook=hook, source=source, api=api)


def open_node(
    who: str, *, gpus: Callable[[], GpuSource], kubeconfig: str | None, hint: str
) -> tuple[GpuSource, LightkubeAPI]:
    """The node's GPUs and the API client, for both node drivers: ``gpus`` opens the fakes or
    NVML (here, so a missing driver is told with ``hint``: where the command's chart gets the
    driver). Logs the GPUs found as ``who``; a CommandError says why not."""
    from gpushare.kube.lightkube_api import LightkubeAPI
    from gpushare.kube.port import KubeError
    from gpushare.node.driverroot import DriverRootError

    try:
        source = gpus()
        api = LightkubeAPI.connect(kubeconfig)
    except (ValueError, KubeError, DriverRootError) as err:
        raise CommandError(str(err)) from None
    except Exception as err:
        raise CommandError(
            f"cannot read GPUs through NVML ({type(err).__name__}: {err}); {hint}"
        ) from None
    found = source.gpus()
    click.echo(
        f"{who}: {len(found)} GPU(s) "
        + ", ".join(f"{g.index}:{g.model}:{g.memory_mib}MiB" for g in found),
        err=True,
    )
    return source, api


def prove_hand_off(options: PluginOptions) -> Proof:
    """Ask the runtime whether it applies the hand-off; refuse (CommandError), warn or log."""
    import logging

    from gpushare.node.cdi import Strategy
    from gpushare.node.handoffproof import (
        Mode,
        ToolkitAnswer,
        on_host,
        prove_cdi,
        prove_envvar,
        refusal,
        skipped,
    )

    handoff = options.handoff
    proof = skipped(handoff.strategy, options.hand_off_check)
    if proof is None and handoff.strategy is Strategy.CDI_CRI:
        from gpushare.deviceplugin.kubelet.cri import ask_runtime

        files = on_host(handoff.refresh().files, handoff.spec_dirs, options.cdi_spec_host_dirs)
        proof = prove_cdi(
            ask_runtime(options.cri_socket),
            spec_files=files,
            spec_dirs=options.cdi_spec_host_dirs,
        )
    elif proof is None:
        proof = prove_envvar(ToolkitAnswer.read(options.toolkit_config))
    log = logging.getLogger("gpushare.deviceplugin.handoff")
    words = refusal(proof, handoff.strategy)
    if words is None:
        log.info("node=%s phase=hand-off-check %s", options.node, proof.summary())
    elif options.hand_off_check is Mode.REFUSE:
        raise CommandError(words)
    else:
        log.warning("node=%s phase=hand-off-check --hand-off-check warn: %s", options.node, words)
    return proof


def run_plugin(wired: Wired) -> None:
    """Serve the metrics and health ports, then run the plugin until it is stopped."""
    import asyncio
    import contextlib

    from gpushare.deviceplugin.metrics import registry_for, serve_metrics
    from gpushare.deviceplugin.readiness import serve_health
    from gpushare.kube.lightkube_api import LightkubeAPI
    from gpushare.node.preflight import StartRefused
    from gpushare.node.usage import UsedSummaryPublisher

    options, plugin, hook, source = wired.options, wired.plugin, wired.hook, wired.source
    guard, cert = None, None
    if options.metrics_port:
        # its own client: the guard asks the API server from the metrics server's thread
        guard, cert = metrics_access(
            LightkubeAPI.connect(options.kubeconfig),
            enabled=options.metrics.enabled,
            cert_file=options.metrics.cert_file,
            key_file=options.metrics.key_file,
            ttl_s=options.metrics.ttl_s,
            name=f"gpushare-device-plugin.{options.node}",
        )
    try:
        serve_metrics(
            registry_for(plugin, options.node, hook.usage),
            port=options.metrics_port,
            guard=guard,
            cert=cert,
        )
    except OSError as err:
        raise CommandError(f"cannot serve metrics on port {options.metrics_port}: {err}") from None
    try:
        serve_health(plugin.not_ready, port=options.health_port)
    except OSError as err:
        raise CommandError(f"cannot serve /readyz on port {options.health_port}: {err}") from None

    async def serve() -> None:
        await plugin.start()
        summary = None
        if options.used_summary_interval_s and hook.counts_usage:
            publisher = UsedSummaryPublisher(
                wired.api,
                options.node,
                usage=hook.usage,
                gpus=lambda: [g.index for g in source.gpus()],
                step_mib=options.settings.unit.mib,
                interval_s=options.used_summary_interval_s,
            )
            summary = asyncio.create_task(publisher.run())
        try:
            await asyncio.Event().wait()
        finally:
            if summary is not None:
                summary.cancel()
            await plugin.stop()

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve())
    except StartRefused as err:
        raise CommandError(str(err)) from None
