"""``gpushare``: the command-line entry point for every component."""

from __future__ import annotations

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
