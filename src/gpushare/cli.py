"""``gpushare``: the command-line entry point for every component."""

from __future__ import annotations

import contextlib
import logging
import sys

import click

from gpushare import __version__
from gpushare.config import ConfigError, load


@click.group()
@click.version_option(__version__, prog_name="gpushare")
def main() -> None:
    """Shared GPU scheduling for Kubernetes (aliyun.com/gpu-mem)."""


@main.command()
def demo() -> None:
    """Run the seed walkthrough in one process, on an in-memory cluster."""
    from gpushare.demo import run_demo

    run_demo()


def _scheduling_options(func: click.decorators.FC) -> click.decorators.FC:
    func = click.option("--gpu-memory-unit", default=None, help="1GiB (default) or 128MiB.")(func)
    func = click.option("--policy", default=None, help="Node-level policy: binpack or spread.")(
        func
    )
    func = click.option(
        "--max-pods-per-gpu",
        type=int,
        default=None,
        help="Pods per GPU under isolation (default 20, or 16 at 128MiB).",
    )(func)
    return func


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=32766, show_default=True, type=int)
@click.option(
    "--kubeconfig", default=None, help="Path to a kubeconfig (default: in-cluster or $KUBECONFIG)."
)
@click.option("--context", default=None)
@click.option("--log-level", default="info", show_default=True)
@_scheduling_options
def extender(
    host: str,
    port: int,
    kubeconfig: str | None,
    context: str | None,
    log_level: str,
    gpu_memory_unit: str | None,
    policy: str | None,
    max_pods_per_gpu: int | None,
) -> None:
    """Serve the kube-scheduler extender (filter, prioritize, bind) over HTTP."""
    import uvicorn

    from gpushare.core.scheduling import Scheduler
    from gpushare.extender.app import create_app
    from gpushare.extender.service import Extender
    from gpushare.kube.cache import ClusterCache
    from gpushare.kube.lightkube_api import LightkubeAPI
    from gpushare.kube.port import KubeError

    try:
        config = load(
            gpu_memory_unit=gpu_memory_unit, policy=policy, max_pods_per_gpu=max_pods_per_gpu
        )
        api = LightkubeAPI.connect(kubeconfig, context)
    except (ConfigError, KubeError) as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(2)
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    settings = config.settings()
    cache = ClusterCache(api, settings=settings)
    service = Extender(api=api, cache=cache, scheduler=Scheduler(settings))
    uvicorn.run(create_app(service, run_cache=True), host=host, port=port, log_level=log_level)


@main.command("device-plugin")
@click.option("--node-name", envvar="NODE_NAME", required=True, help="This node (env NODE_NAME).")
@click.option(
    "--fake-gpus", default=None, help="Fake GPUs instead of NVML: 4x15GiB or T4:15GiB,A10:24GiB."
)
@click.option("--gpu-memory-unit", default="1GiB", show_default=True)
@click.option("--device-plugin-dir", default="/var/lib/kubelet/device-plugins", show_default=True)
@click.option(
    "--pod-resources-socket",
    default="/var/lib/kubelet/pod-resources/kubelet.sock",
    show_default=True,
)
@click.option("--state-dir", default="/var/lib/gpushare", show_default=True)
@click.option("--kubelet-config", default="/var/lib/kubelet/config.yaml", show_default=True)
@click.option(
    "--cpu-manager-state", default="/var/lib/kubelet/cpu_manager_state", show_default=True
)
@click.option("--kubeconfig", default=None)
@click.option("--log-level", default="info", show_default=True)
def device_plugin(
    node_name: str,
    fake_gpus: str | None,
    gpu_memory_unit: str,
    device_plugin_dir: str,
    pod_resources_socket: str,
    state_dir: str,
    kubelet_config: str,
    cpu_manager_state: str,
    kubeconfig: str | None,
    log_level: str,
) -> None:
    """Serve kubelet's device plugin API for this node's shared GPUs."""
    import asyncio
    from pathlib import Path

    from gpushare.core.units import MemoryUnit
    from gpushare.deviceplugin.gpus import FakeGpus, GpuSource, NvmlGpus
    from gpushare.deviceplugin.plugin import DevicePlugin, PluginConfig, refuse_static_cpu_policy
    from gpushare.kube.lightkube_api import LightkubeAPI
    from gpushare.kube.port import KubeError

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    reason = refuse_static_cpu_policy(Path(kubelet_config), Path(cpu_manager_state))
    if reason:
        click.echo(f"error: {reason}", err=True)
        sys.exit(2)
    try:
        unit = MemoryUnit.parse(gpu_memory_unit)
        source: GpuSource = FakeGpus.parse(fake_gpus, node=node_name) if fake_gpus else NvmlGpus()
        api = LightkubeAPI.connect(kubeconfig)
    except ValueError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(2)
    except KubeError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(2)
    except Exception as err:
        click.echo(
            f"error: cannot read GPUs through NVML ({type(err).__name__}: {err}); "
            f"is the NVIDIA driver installed? For tests use --fake-gpus",
            err=True,
        )
        sys.exit(2)
    gpus = source.gpus()
    click.echo(
        f"gpushare device plugin on {node_name}: {len(gpus)} GPU(s) "
        + ", ".join(f"{g.index}:{g.model}:{g.memory_mib}MiB" for g in gpus),
        err=True,
    )
    config = PluginConfig(
        node=node_name,
        plugin_dir=Path(device_plugin_dir),
        pod_resources_socket=Path(pod_resources_socket),
        state_dir=Path(state_dir),
        unit=unit,
    )

    async def serve() -> None:
        plugin = DevicePlugin(api=api, source=source, config=config)
        await plugin.start()
        try:
            await asyncio.Event().wait()
        finally:
            await plugin.stop()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


@main.command("scheduler-config")
@click.option(
    "--url",
    default="http://127.0.0.1:32766",
    show_default=True,
    help="The extender's URL as kube-scheduler reaches it.",
)
@click.option(
    "--kubeconfig",
    default="/etc/kubernetes/scheduler.conf",
    show_default=True,
    help="kube-scheduler's own kubeconfig path ('' to leave out).",
)
@click.option("--no-leader-elect", is_flag=True)
def scheduler_config(url: str, kubeconfig: str, no_leader_elect: bool) -> None:
    """Print the KubeSchedulerConfiguration wiring kube-scheduler to the extender."""
    from gpushare.schedconfig import render_yaml, scheduler_configuration

    click.echo(
        render_yaml(
            scheduler_configuration(
                url=url, kubeconfig=kubeconfig or None, leader_elect=not no_leader_elect
            )
        ),
        nl=False,
    )
