"""``gpushare dra-driver``: the DRA kubelet plugin for one node's shared GPUs (docs/dra.md).

The composition root, modelled on ``gpushare device-plugin``'s: the flags are validated first
(the memory unit, the cGPU policy and pods per GPU, the hand-off), then :func:`build_driver`
checks what only the node can say (the state and library directories, the GPUs, the API
client) and wires the driver with the same isolation hook as the device plugin, and
:func:`run_driver` serves ``/readyz`` and runs it. The driver's own start refuses a node not
labelled ``gpushare.io/allocation-mode=dra``, and ends the command the same way (exit 2).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from gpushare.cli.errors import CommandError
from gpushare.cli.logs import log_format_option, log_level_option, setup_logging

if TYPE_CHECKING:
    from gpushare.dra.driver import DraDriver

NVML_HINT = (
    "is the NVIDIA driver installed, and does this container see /dev/nvidiactl, "
    "/dev/nvidia<N> and libnvidia-ml.so.1? The chart gets them from the NVIDIA container "
    "runtime (dra.driver.runtimeClassName where it is not the node's default). For tests use "
    "--fake-gpus"
)


@click.command("dra-driver")
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
    "--gpu-memory-unit",
    default="1GiB",
    envvar="GPUSHARE_MEMORY_UNIT",
    show_default=True,
    help="The node's memory unit: the slice's memory step and ALIYUN_COM_GPU_MEM_*'s unit "
    "(1GiB or 128MiB).",
)
@click.option(
    "--state-dir",
    default="/var/lib/gpushare",
    show_default=True,
    help="The prepared-claims checkpoint, limits files, broker sockets; the same path as on "
    "the host.",
)
@click.option(
    "--cdi-dir",
    default="/var/run/cdi",
    show_default=True,
    help="Where each prepared claim's CDI spec is written: one of the container runtime's "
    "cdi_spec_dirs, writable.",
)
@click.option(
    "--plugins-dir",
    default="/var/lib/kubelet/plugins",
    show_default=True,
    help="kubelet's plugins directory (<root-dir>/plugins): the DRA service listens on "
    "<dir>/gpushare.io/dra.sock.",
)
@click.option(
    "--registry-dir",
    default="/var/lib/kubelet/plugins_registry",
    show_default=True,
    help="kubelet's plugin registration directory (<root-dir>/plugins_registry).",
)
@click.option("--kubeconfig", default=None)
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
    help="cgpu nodes: ACK's cGPU computing-power policy (0-5), as the device plugin's.",
)
@click.option(
    "--max-pods-per-gpu",
    default=None,
    envvar="GPUSHARE_MAX_PODS_PER_GPU",
    help="The chart's maxPodsPerGpu (cGPU policy 0's share).",
)
@click.option(
    "--device-list-strategy",
    default="cdi-cri",
    envvar="GPUSHARE_DEVICE_LIST_STRATEGY",
    show_default=True,
    help="How a claim's GPUs reach the container: cdi-cri (the GPU's CDI device KIND=<uuid> "
    "beside the claim's, NVIDIA_VISIBLE_DEVICES=void), envvar (NVIDIA_VISIBLE_DEVICES=<uuid> in "
    "the claim's CDI spec) or driver-root (device nodes and --driver-root).",
)
@click.option("--driver-root", default="", help="The host's NVIDIA driver directory (driver-root).")
@click.option("--driver-root-container-path", default="/usr/local/nvidia", show_default=True)
@click.option("--dev-root", default="/dev", show_default=True)
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
    help="cdi-cri: where the node's CDI specs are, comma-separated (checked at start).",
)
@click.option(
    "--health-port",
    type=click.IntRange(min=0, max=65535),
    default=0,
    show_default=True,
    help="Serve /healthz and /readyz on 127.0.0.1 (0 disables): /readyz answers 503 with the "
    "reason until kubelet registered the driver and the slice is published.",
)
@log_level_option
@log_format_option
def dra_driver(**flags: Any) -> None:
    """Serve kubelet's DRA plugin API for this node's shared GPUs (DRA mode)."""
    setup_logging(flags["log_level"], flags["log_format"])
    run_driver(build_driver(flags), health_port=flags["health_port"])


def build_driver(flags: dict[str, Any]) -> DraDriver:
    """Validate the flags, check the node's directories and GPUs, wire the driver."""
    from gpushare.cli.pluginoptions import driver_root_of
    from gpushare.core.model.units import MemoryUnit
    from gpushare.dra.driver import DraDriver, DriverConfig
    from gpushare.dra.kubeletapi import Sockets
    from gpushare.isolation.policy import PolicyError, parse_max_pods, parse_policy
    from gpushare.kube.lightkube_api import LightkubeAPI
    from gpushare.kube.port import KubeError
    from gpushare.node.cdi import HandOff, HandOffError, Strategy, parse_kind, parse_strategy
    from gpushare.node.descriptors import BrokerCaps, descriptor_limit
    from gpushare.node.driverroot import DriverRootError
    from gpushare.node.enforcement.library import packaged_library
    from gpushare.node.enforcement.mountcheck import MountCheck, packaged_mountcheck
    from gpushare.node.enforcement.nodehook import NodeIsolation
    from gpushare.node.gpus import FakeGpus, GpuSource, NvmlGpus
    from gpushare.node.hostpaths import refuse_lib_dir, refuse_state_dir

    try:
        unit = MemoryUnit.parse(flags["gpu_memory_unit"])
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--gpu-memory-unit") from None
    try:
        policy = parse_policy(flags["cgpu_policy"], "--cgpu-policy (GPUSHARE_ISOLATION_POLICY)")
        given = flags["max_pods_per_gpu"]
        max_pods = None if given is None else parse_max_pods(given)
    except PolicyError as err:
        raise click.BadParameter(str(err)) from None
    try:
        handoff = HandOff(
            strategy=parse_strategy(flags["device_list_strategy"]),
            kind=parse_kind(flags["cdi_kind"]),
            spec_dirs=tuple(
                Path(d.strip()) for d in flags["cdi_spec_dirs"].split(",") if d.strip()
            ),
            driver_root=driver_root_of(flags),
        )
    except HandOffError as err:
        raise click.BadParameter(str(err)) from None
    state_dir, lib_dir = Path(flags["state_dir"]), Path(flags["isolation_lib_dir"])
    reason = refuse_state_dir(state_dir)
    if flags["isolation"] != "none":
        reason = reason or refuse_lib_dir(lib_dir)
    if reason is not None:
        raise CommandError(reason)
    node = flags["node_name"]
    try:
        source: GpuSource = (
            FakeGpus.parse(flags["fake_gpus"], node=node, health_file=_path(flags))
            if flags["fake_gpus"]
            else NvmlGpus(handoff.driver_root)
        )
        api = LightkubeAPI.connect(flags["kubeconfig"])
    except (ValueError, KubeError, DriverRootError) as err:
        raise CommandError(str(err)) from None
    except Exception as err:
        raise CommandError(
            f"cannot read GPUs through NVML ({type(err).__name__}: {err}); {NVML_HINT}"
        ) from None
    gpus = source.gpus()
    click.echo(
        f"gpushare DRA driver on {node}: {len(gpus)} GPU(s) "
        + ", ".join(f"{g.index}:{g.model}:{g.memory_mib}MiB" for g in gpus),
        err=True,
    )
    hook = NodeIsolation(
        caps=BrokerCaps(descriptors=descriptor_limit()),
        cgpu_policy=policy,
        max_pods=max_pods,
        policy=flags["isolation"],
        lib_dir=lib_dir,
        state_dir=state_dir,
        unit=unit,
        source=source,
        packaged=packaged_library(),
        # the runtime's check of the isolation mounts, as the device plugin's (docs/isolation.md)
        mount_check=(
            MountCheck(
                spec_dir=Path(flags["cdi_dir"]),
                lib_dir=lib_dir,
                watched=(state_dir, lib_dir),
                packaged=packaged_mountcheck(),
            )
            if handoff.strategy is Strategy.CDI_CRI
            else None
        ),
    )
    config = DriverConfig(
        node=node,
        unit=unit,
        state_dir=state_dir,
        cdi_dir=Path(flags["cdi_dir"]),
        sockets=Sockets(
            registry_dir=Path(flags["registry_dir"]),
            plugin_dir=Path(flags["plugins_dir"]) / "gpushare.io",
        ),
        handoff=handoff,
        max_pods=max_pods or unit.default_max_pods_per_gpu,
    )
    return DraDriver(api=api, source=source, config=config, hook=hook)


def _path(flags: dict[str, Any]) -> Path | None:
    value = flags["fake_health_file"]
    return Path(value) if value else None


def run_driver(driver: DraDriver, *, health_port: int) -> None:
    """Serve ``/readyz``, then run the driver until it is stopped (SIGTERM or SIGINT)."""
    import asyncio
    import contextlib
    import signal

    from gpushare.deviceplugin.readiness import serve_health
    from gpushare.kube.port import KubeError
    from gpushare.node.preflight import StartRefused

    try:
        serve_health(driver.not_ready, port=health_port)
    except OSError as err:
        raise CommandError(f"cannot serve /readyz on port {health_port}: {err}") from None

    async def serve() -> None:
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        await driver.start()
        try:
            await stopping.wait()
        finally:
            await driver.stop()

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve())
    except StartRefused as err:
        raise CommandError(str(err)) from None
    except KubeError as err:
        raise CommandError(f"the API server refused the driver: {err}") from None
