"""``gpushare device-plugin``: kubelet's device plugin for one node's shared GPUs.

The command checks what it can before touching the node, in this order, and refuses with the
reason: the cGPU policy and pods per GPU (flags or the chart's environment), the seal key,
kubelet's CPU manager policy (read from kubelet's files), a fake topology without fake GPUs, the
scheduling settings (through ``gpushare.config``, as the extender reads the same values), the
GPUs (NVML, or fakes for tests) and the API client. The plugin's own preflight
(``node.preflight``: the node's mode label, a unit change under pods, the isolation hook)
refuses from inside the running plugin and ends the command the same way.
"""

from __future__ import annotations

import click

from gpushare.cli.errors import CommandError
from gpushare.cli.logs import log_format_option, log_level_option, setup_logging
from gpushare.cli.options import resource_name_options, scheduling_config
from gpushare.cli.scrapeaccess import metrics_access, metrics_access_options
from gpushare.cli.sealing import seal_options, trust_from_flags

NVML_HINT = (
    "is the NVIDIA driver installed, and does this container see /dev/nvidiactl, "
    "/dev/nvidia<N> and libnvidia-ml.so.1? The chart gets them from the NVIDIA "
    "container runtime (NVIDIA_VISIBLE_DEVICES=all; set devicePlugin.runtimeClassName "
    "where it is not the node's default runtime). For tests use --fake-gpus"
)


@click.command("device-plugin")
@click.option("--node-name", envvar="NODE_NAME", required=True, help="This node (env NODE_NAME).")
@click.option(
    "--fake-gpus", default=None, help="Fake GPUs instead of NVML: 4x15GiB or T4:15GiB,A10:24GiB."
)
@click.option(
    "--fake-health-file",
    default=None,
    help="With --fake-gpus: a file listing the indexes of failed GPUs (tests withdraw GPUs).",
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
    "--state-dir",
    default="/var/lib/gpushare",
    show_default=True,
    help=(
        "Checkpoint, limits files, accounting broker sockets and MPS pipes; the same path as "
        "on the host."
    ),
)
@click.option(
    "--isolation",
    type=click.Choice(["auto", "none"]),
    default="auto",
    show_default=True,
    help="auto: enforce cgpu/core_mem (interposer) and mps limits, refusing to start when it "
    "cannot; none: serve every mode without isolation.",
)
@click.option(
    "--isolation-lib-dir",
    default="/usr/local/gpushare",
    show_default=True,
    help="Host directory the interposer library is copied into and mounted from.",
)
@click.option(
    "--cgpu-policy",
    default="5",
    envvar="GPUSHARE_ISOLATION_POLICY",
    show_default=True,
    help="cgpu nodes: ACK's cGPU computing-power policy, 0 even share, 1 preemptive, "
    "2 weighted preemptive, 3 fixed share, 4 soft, 5 native (no limit).",
)
@click.option(
    "--max-pods-per-gpu",
    default=None,
    envvar="GPUSHARE_MAX_PODS_PER_GPU",
    help="The chart's maxPodsPerGpu (1..64; default 20, or 16 at 128MiB): cGPU policy 0 gives "
    "each container one over it, and it bounds ALIYUN_COM_GPU_SCHD_WEIGHT.",
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
    "--device-list-strategy",
    default="cdi-cri",
    envvar="GPUSHARE_DEVICE_LIST_STRATEGY",
    show_default=True,
    help="How Allocate hands the placed GPUs over: cdi-cri (CDI devices KIND=<uuid>, which the "
    "node's CDI spec must name; NVIDIA_VISIBLE_DEVICES=void) or envvar "
    "(NVIDIA_VISIBLE_DEVICES=<uuids>, for nodes without CDI). docs/gpu-operator.md.",
)
@click.option(
    "--cdi-kind",
    default="nvidia.com/gpu",
    show_default=True,
    help="cdi-cri: the CDI kind of the GPUs, as the NVIDIA Container Toolkit's spec declares it.",
)
@click.option(
    "--cdi-spec-dirs",
    default="/etc/cdi,/var/run/cdi",
    show_default=True,
    help="cdi-cri: where the node's CDI specs are (the container runtime's cdi_spec_dirs), "
    "comma-separated.",
)
@click.option(
    "--cdi-hook-dir",
    default="/var/run/cdi",
    show_default=True,
    help="cdi-cri: where the plugin writes the CDI spec of its isolation check, a hook that "
    "refuses a container whose isolation mounts a volume or an image link moved; one of the "
    "runtime's cdi_spec_dirs, writable. docs/isolation.md.",
)
@click.option("--kubelet-config", default="/var/lib/kubelet/config.yaml", show_default=True)
@click.option(
    "--cpu-manager-state", default="/var/lib/kubelet/cpu_manager_state", show_default=True
)
@click.option("--kubeconfig", default=None)
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
    "--health-port",
    type=click.IntRange(min=0, max=65535),
    default=0,
    show_default=True,
    help="Serve /healthz and /readyz on 127.0.0.1 at this port (0 disables): /readyz answers "
    "503 with the reason until the plugin has registered, and while the API server refuses "
    "its pod watch (the chart's readiness probe reads it).",
)
@click.option(
    "--used-summary-interval",
    type=click.FloatRange(min=0),
    default=300.0,
    show_default=True,
    help="Seconds between checks of the GPU memory in use that cgpu and core_mem nodes "
    "publish as the node annotation gpushare.io/gpu-used (written only when a GPU's use moved "
    "by a memory unit; kubectl inspect cgpu -d shows it); 0 never writes it.",
)
@resource_name_options
@seal_options
def device_plugin(
    node_name: str,
    fake_gpus: str | None,
    fake_health_file: str | None,
    fake_topology: str,
    gpu_memory_unit: str,
    device_plugin_dir: str,
    pod_resources_socket: str,
    state_dir: str,
    isolation: str,
    isolation_lib_dir: str,
    cgpu_policy: str,
    max_pods_per_gpu: str | None,
    broker_max_connections_per_pod: int,
    broker_max_connections_per_node: int,
    broker_min_connections_per_container: int,
    broker_idle_timeout: float,
    device_list_strategy: str,
    cdi_kind: str,
    cdi_spec_dirs: str,
    cdi_hook_dir: str,
    kubelet_config: str,
    cpu_manager_state: str,
    kubeconfig: str | None,
    log_level: str,
    log_format: str,
    metrics_port: int,
    health_port: int,
    metrics_authorization: bool,
    metrics_tls_cert_file: str | None,
    metrics_tls_private_key_file: str | None,
    metrics_auth_cache_ttl: float,
    used_summary_interval: float,
    mem_resource: str | None,
    core_resource: str | None,
    count_resource: str | None,
    seal_key_file: str | None,
    insecure_no_seal: bool,
) -> None:
    """Serve kubelet's device plugin API for this node's shared GPUs."""
    from gpushare.isolation.policy import PolicyError, parse_max_pods, parse_policy

    try:
        policy_number = parse_policy(cgpu_policy, "--cgpu-policy (GPUSHARE_ISOLATION_POLICY)")
    except PolicyError as err:
        raise click.BadParameter(str(err), param_hint="--cgpu-policy") from None
    try:
        max_pods = None if max_pods_per_gpu is None else parse_max_pods(max_pods_per_gpu)
    except PolicyError as err:
        raise click.BadParameter(str(err), param_hint="--max-pods-per-gpu") from None
    import asyncio
    import contextlib
    from pathlib import Path

    from gpushare.node.cdi import (
        HandOff,
        HandOffError,
        Strategy,
        parse_kind,
        parse_strategy,
    )

    try:
        handoff = HandOff(
            strategy=parse_strategy(device_list_strategy),
            kind=parse_kind(cdi_kind),
            spec_dirs=tuple(Path(d.strip()) for d in cdi_spec_dirs.split(",") if d.strip()),
        )
    except HandOffError as err:
        raise click.BadParameter(str(err)) from None
    from gpushare.deviceplugin.config import PluginConfig, Stats
    from gpushare.deviceplugin.metrics import registry_for, serve_metrics
    from gpushare.deviceplugin.plugin import DevicePlugin
    from gpushare.deviceplugin.readiness import serve_health
    from gpushare.kube.lightkube_api import LightkubeAPI
    from gpushare.kube.port import KubeError
    from gpushare.node.descriptors import (
        RESERVED,
        BrokerCaps,
        CapsError,
        descriptor_limit,
    )
    from gpushare.node.enforcement.library import packaged_library
    from gpushare.node.enforcement.mountcheck import MountCheck, packaged_mountcheck
    from gpushare.node.enforcement.nodehook import NodeIsolation
    from gpushare.node.gpus import FakeGpus, GpuSource, NvmlGpus
    from gpushare.node.preflight import StartRefused, refuse_static_cpu_policy
    from gpushare.node.usage import UsedSummaryPublisher

    try:
        caps = BrokerCaps(
            per_pod=broker_max_connections_per_pod,
            per_node=broker_max_connections_per_node,
            kept=broker_min_connections_per_container,
            idle_s=broker_idle_timeout,
            descriptors=descriptor_limit(),
        )
    except CapsError as err:
        raise CommandError(str(err)) from None
    setup_logging(log_level, log_format)
    trust = trust_from_flags(seal_key_file, insecure_no_seal)
    reason = refuse_static_cpu_policy(Path(kubelet_config), Path(cpu_manager_state))
    if reason:
        raise CommandError(reason)
    if fake_topology and not fake_gpus:
        raise CommandError("--fake-topology describes fake GPUs; give --fake-gpus too")
    # An empty resource name keeps the default, as an unset one does.
    settings = scheduling_config(
        gpu_memory_unit=gpu_memory_unit,
        max_pods_per_gpu=max_pods,
        mem_resource=mem_resource or None,
        core_resource=core_resource or None,
        count_resource=count_resource or None,
    ).settings()
    try:
        health = Path(fake_health_file) if fake_health_file else None
        source: GpuSource = (
            FakeGpus.parse(fake_gpus, node=node_name, health_file=health, topology=fake_topology)
            if fake_gpus
            else NvmlGpus()
        )
        api = LightkubeAPI.connect(kubeconfig)
    except (ValueError, KubeError) as err:
        raise CommandError(str(err)) from None
    except Exception as err:
        raise CommandError(
            f"cannot read GPUs through NVML ({type(err).__name__}: {err}); {NVML_HINT}"
        ) from None
    gpus = source.gpus()
    click.echo(
        f"gpushare device plugin on {node_name}: {len(gpus)} GPU(s) "
        + ", ".join(f"{g.index}:{g.model}:{g.memory_mib}MiB" for g in gpus),
        err=True,
    )
    click.echo(
        f"accounting broker: at most {caps.per_pod} connections per pod, "
        f"{caps.room(listeners=0)} per node, {caps.kept} kept for each container "
        f"(open-file limit {caps.descriptors or 'unlimited'}, "
        f"{RESERVED} kept for the plugin's own work)",
        err=True,
    )
    config = PluginConfig(
        node=node_name,
        plugin_dir=Path(device_plugin_dir),
        pod_resources_socket=Path(pod_resources_socket),
        state_dir=Path(state_dir),
        unit=settings.unit,
        max_pods_per_gpu=settings.max_pods_per_gpu,
        names=settings.names,
        handoff=handoff,
    )
    stats = Stats()
    hook = NodeIsolation(
        caps=caps,
        broker_stats=stats.broker,
        cgpu_policy=policy_number,
        max_pods=max_pods,
        policy=isolation,
        lib_dir=Path(isolation_lib_dir),
        state_dir=Path(state_dir),
        unit=settings.unit,
        source=source,
        packaged=packaged_library(),
        mount_check=(
            MountCheck(
                spec_dir=Path(cdi_hook_dir),
                lib_dir=Path(isolation_lib_dir),
                watched=(Path(state_dir), Path(isolation_lib_dir)),
                packaged=packaged_mountcheck(),
            )
            if handoff.strategy is Strategy.CDI_CRI
            else None
        ),
    )
    plugin = DevicePlugin(
        api=api, source=source, config=config, hook=hook, trust=trust, stats=stats
    )
    guard, cert = None, None
    if metrics_port:
        # its own client: the guard asks the API server from the metrics server's thread
        guard, cert = metrics_access(
            LightkubeAPI.connect(kubeconfig),
            enabled=metrics_authorization,
            cert_file=metrics_tls_cert_file,
            key_file=metrics_tls_private_key_file,
            ttl_s=metrics_auth_cache_ttl,
            name=f"gpushare-device-plugin.{node_name}",
        )
    try:
        serve_metrics(
            registry_for(plugin, node_name, hook.usage), port=metrics_port, guard=guard, cert=cert
        )
    except OSError as err:
        raise CommandError(f"cannot serve metrics on port {metrics_port}: {err}") from None
    try:
        serve_health(plugin.not_ready, port=health_port)
    except OSError as err:
        raise CommandError(f"cannot serve /readyz on port {health_port}: {err}") from None

    async def serve() -> None:
        await plugin.start()
        summary = None
        if used_summary_interval and hook.counts_usage:
            publisher = UsedSummaryPublisher(
                api,
                node_name,
                usage=hook.usage,
                gpus=lambda: [g.index for g in source.gpus()],
                step_mib=settings.unit.mib,
                interval_s=used_summary_interval,
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
