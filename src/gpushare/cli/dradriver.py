"""``gpushare dra-driver``: the DRA kubelet plugin for one node's shared GPUs (docs/dra.md).

The composition root, modelled on ``gpushare device-plugin``'s: the flags are validated first
(the memory unit; the cGPU policy, pods per GPU and hand-off through the device plugin's
``cli.pluginoptions.isolation_flags``, the flags the two share), then :func:`build_driver`
checks what only the node can say (the state and library directories; the GPUs and the API
client, opened by the device plugin's ``cli.deviceplugin.open_node``) and wires the driver
with the same isolation hook as the device plugin, and :func:`run_driver` serves ``/readyz``
and runs it. The driver's own start refuses a node not labelled
``gpushare.io/allocation-mode=dra``, and ends the command the same way (exit 2).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from gpushare.cli.errors import CommandError
from gpushare.cli.logs import log_format_option, log_level_option, setup_logging
from gpushare.cli.options import node_driver_options

if TYPE_CHECKING:
    from gpushare.dra.driver import DraDriver

NVML_HINT = (
    "is the NVIDIA driver installed, and does this container see /dev/nvidiactl, "
    "/dev/nvidia<N> and libnvidia-ml.so.1? The chart gets them from the NVIDIA container "
    "runtime (dra.driver.runtimeClassName where it is not the node's default). For tests use "
    "--fake-gpus"
)


@click.command("dra-driver")
@node_driver_options(
    state_dir_help="The prepared-claims checkpoint, limits files, broker sockets; the same path "
    "as on the host.",
    strategy_help="How a claim's GPUs reach the container: cdi-cri (the GPU's CDI device "
    "KIND=<uuid> beside the claim's, NVIDIA_VISIBLE_DEVICES=void), envvar "
    "(NVIDIA_VISIBLE_DEVICES=<uuid> in the claim's CDI spec) or driver-root (device nodes and "
    "--driver-root).",
    health_help="Serve /healthz and /readyz on 127.0.0.1 (0 disables): /readyz answers 503 with "
    "the reason until kubelet registered the driver and the slice is published.",
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
@log_level_option
@log_format_option
def dra_driver(**flags: Any) -> None:
    """Serve kubelet's DRA plugin API for this node's shared GPUs (DRA mode)."""
    setup_logging(flags["log_level"], flags["log_format"])
    run_driver(build_driver(flags), health_port=flags["health_port"])


def build_driver(flags: dict[str, Any]) -> DraDriver:
    """Validate the flags, check the node's directories and GPUs, wire the driver."""
    from gpushare.cli.deviceplugin import open_node
    from gpushare.cli.pluginoptions import isolation_flags
    from gpushare.core.model.units import MemoryUnit
    from gpushare.dra.driver import DraDriver, DriverConfig
    from gpushare.dra.kubeletapi import Sockets
    from gpushare.node.cdi import Strategy
    from gpushare.node.descriptors import BrokerCaps, descriptor_limit
    from gpushare.node.enforcement.library import packaged_library
    from gpushare.node.enforcement.mountcheck import MountCheck, packaged_mountcheck
    from gpushare.node.enforcement.nodehook import NodeIsolation
    from gpushare.node.gpus import FakeGpus, NvmlGpus
    from gpushare.node.hostpaths import refuse_lib_dir, refuse_state_dir

    try:
        unit = MemoryUnit.parse(flags["gpu_memory_unit"])
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--gpu-memory-unit") from None
    given = isolation_flags(flags)
    policy, max_pods, handoff = given.cgpu_policy, given.max_pods, given.handoff
    state_dir, lib_dir = Path(flags["state_dir"]), Path(flags["isolation_lib_dir"])
    reason = refuse_state_dir(state_dir)
    if flags["isolation"] != "none":
        reason = reason or refuse_lib_dir(lib_dir)
    if reason is not None:
        raise CommandError(reason)
    node = flags["node_name"]
    source, api = open_node(
        f"gpushare DRA driver on {node}",
        gpus=(
            partial(FakeGpus.parse, flags["fake_gpus"], node=node, health_file=_path(flags))
            if flags["fake_gpus"]
            else partial(NvmlGpus, handoff.driver_root)
        ),
        kubeconfig=flags["kubeconfig"],
        hint=NVML_HINT,
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
