"""``kubectl-inspect-cgpu``: the kubectl plugin (``kubectl inspect cgpu``).

It lists nodes and pods once, rebuilds the ledger from pod annotations exactly as the extender
does, and prints the view. It reads ``$KUBECONFIG`` like kubectl, and also takes
``--kubeconfig`` and ``--context``.
"""

from __future__ import annotations

import asyncio
import json
import sys

import click

from gpushare.core.inventory import read_node
from gpushare.core.ledger import Ledger
from gpushare.core.units import MemoryUnit
from gpushare.inspect.render import render_details, render_summary
from gpushare.inspect.view import ClusterView, build_view, to_json
from gpushare.kube.port import KubeAPI, KubeError


async def collect(api: KubeAPI, *, unit: MemoryUnit = MemoryUnit.GiB) -> ClusterView:
    """List nodes and pods through the port and build the view."""
    nodes, _ = await api.list_nodes()
    pods, _ = await api.list_pods()
    ledger = Ledger.from_pods(pods, unit=unit)
    return build_view((read_node(n, cluster_unit=unit) for n in nodes), ledger)


def render(view: ClusterView, *, details: bool, output: str) -> str:
    """The chosen rendering of a view."""
    if output == "json":
        return json.dumps(to_json(view), indent=2, sort_keys=True) + "\n"
    return render_details(view) if details else render_summary(view)


async def _fetch(kubeconfig: str | None, context: str | None, unit: MemoryUnit) -> ClusterView:
    from gpushare.kube.lightkube_api import LightkubeAPI

    api = LightkubeAPI.connect(kubeconfig, context)
    try:
        return await collect(api, unit=unit)
    except KubeError as err:
        raise KubeError(f"cannot read from the Kubernetes API at {api.server}: {err}") from None
    finally:
        await api.close()


@click.command(name="kubectl-inspect-cgpu")
@click.option("-d", "--details", is_flag=True, help="Show each node's pods and their GPUs.")
@click.option(
    "-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True
)
@click.option("--kubeconfig", envvar=None, help="Path to a kubeconfig (default: $KUBECONFIG).")
@click.option("--context", help="The kubeconfig context to use.")
@click.option(
    "--unit",
    default="1GiB",
    show_default=True,
    help="gpuMemoryUnit assumed for nodes that do not declare theirs.",
)
def main(
    details: bool, output: str, kubeconfig: str | None, context: str | None, unit: str
) -> None:
    """Show how much GPU memory each node's GPUs have allocated."""
    try:
        memory_unit = MemoryUnit.parse(unit)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--unit") from None
    try:
        view = asyncio.run(_fetch(kubeconfig, context, memory_unit))
    except KubeError as err:
        click.echo(f"error: {err}", err=True)
        click.echo(
            "hint: check that the cluster is up and that KUBECONFIG, --kubeconfig or "
            "--context point at it",
            err=True,
        )
        sys.exit(1)
    click.echo(render(view, details=details, output=output), nl=False)
