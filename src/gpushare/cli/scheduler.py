"""``gpushare scheduler-config``: the KubeSchedulerConfiguration that calls the extender.

Printed rather than written, so it can be piped into a ConfigMap or a file for kube-scheduler's
``--config``; the configuration itself is built in ``gpushare.schedconfig``, which the chart's
template is tested against.
"""

from __future__ import annotations

import click


@click.command("scheduler-config")
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
@click.option(
    "--percentage-of-nodes-to-score",
    "percentage",
    type=click.IntRange(0, 100),
    default=100,
    show_default=True,
    help="The GPU profile's percentageOfNodesToScore: 100 ranks every feasible node (packing); "
    "lower trades packing for speed on large clusters; 0 is kube-scheduler's adaptive sample.",
)
def scheduler_config(url: str, kubeconfig: str, no_leader_elect: bool, percentage: int) -> None:
    """Print the KubeSchedulerConfiguration wiring kube-scheduler to the extender."""
    from gpushare.schedconfig import render_yaml, scheduler_configuration

    click.echo(
        render_yaml(
            scheduler_configuration(
                url=url,
                kubeconfig=kubeconfig or None,
                leader_elect=not no_leader_elect,
                percentage=percentage,
            )
        ),
        nl=False,
    )
