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
from gpushare.core.kubejson import name_of, namespace_of
from gpushare.core.ledger import Ledger
from gpushare.core.scheduling import Scheduler, Settings
from gpushare.core.units import MemoryUnit
from gpushare.inspect.explain import Explanation, explain_pod, explanation_json
from gpushare.inspect.render import render_details, render_explanation, render_summary
from gpushare.inspect.view import ClusterView, build_view, to_json
from gpushare.kube.port import KubeAPI, KubeError


async def collect(api: KubeAPI, *, unit: MemoryUnit = MemoryUnit.GiB) -> ClusterView:
    """List nodes and pods through the port and build the view."""
    nodes, _ = await api.list_nodes()
    pods, _ = await api.list_pods()
    ledger = Ledger.from_pods(pods, unit=unit)
    return build_view((read_node(n, cluster_unit=unit) for n in nodes), ledger)


class PodNotFound(KubeError):
    """The pod to explain is not in the cluster."""


async def collect_explanation(
    api: KubeAPI, namespace: str, name: str, *, settings: Settings
) -> Explanation:
    """List nodes and pods, rebuild the ledger and run the extender's filter for one pod."""
    nodes, _ = await api.list_nodes()
    pods, _ = await api.list_pods()
    found = [p for p in pods if namespace_of(p) == namespace and name_of(p) == name]
    if not found:
        raise PodNotFound(f"pod {namespace}/{name} not found")
    ledger = Ledger.from_pods(pods, names=settings.names, unit=settings.unit)
    inventories = [read_node(n, cluster_unit=settings.unit, names=settings.names) for n in nodes]
    return explain_pod(found[0], inventories, ledger, Scheduler(settings))


def render_explained(explanation: Explanation, *, output: str) -> str:
    """The chosen rendering of an explanation."""
    if output == "json":
        return json.dumps(explanation_json(explanation), indent=2, sort_keys=True) + "\n"
    return render_explanation(explanation)


def render(view: ClusterView, *, details: bool, output: str) -> str:
    """The chosen rendering of a view."""
    if output == "json":
        return json.dumps(to_json(view), indent=2, sort_keys=True) + "\n"
    return render_details(view) if details else render_summary(view)


async def _fetch(
    kubeconfig: str | None,
    context: str | None,
    unit: MemoryUnit,
    explain: tuple[str, str, Settings] | None = None,
) -> ClusterView | Explanation:
    from gpushare.kube.lightkube_api import LightkubeAPI

    api = LightkubeAPI.connect(kubeconfig, context)
    try:
        if explain is not None:
            return await collect_explanation(api, explain[0], explain[1], settings=explain[2])
        return await collect(api, unit=unit)
    except PodNotFound:
        raise
    except KubeError as err:
        raise KubeError(f"cannot read from the Kubernetes API at {api.server}: {err}") from None
    finally:
        await api.close()


@click.command(name="kubectl-inspect-cgpu")
@click.option("-d", "--details", is_flag=True, help="Show each node's pods and their GPUs.")
@click.option(
    "-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True
)
@click.option(
    "-e",
    "--explain",
    metavar="[NAMESPACE/]POD",
    default=None,
    help="Say, node by node, whether this pod would fit now and why not (a what-if).",
)
@click.option(
    "-n", "--namespace", default="default", show_default=True, help="Namespace of --explain's pod."
)
@click.option(
    "--policy",
    default="binpack",
    show_default=True,
    help="The extender's --policy, for --explain's GPU choice and scores.",
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
    details: bool,
    output: str,
    explain: str | None,
    namespace: str,
    policy: str,
    kubeconfig: str | None,
    context: str | None,
    unit: str,
) -> None:
    """Show how much GPU memory each node's GPUs have allocated, or explain one pod."""
    try:
        memory_unit = MemoryUnit.parse(unit)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--unit") from None
    target: tuple[str, str, Settings] | None = None
    if explain is not None:
        pod_ns, _, pod_name = explain.rpartition("/")
        if not pod_name:
            raise click.BadParameter(f"{explain!r}: write NAMESPACE/POD or POD", param_hint="-e")
        settings = Settings(unit=memory_unit, policy=policy)
        try:
            Scheduler(settings)
        except (KeyError, ValueError) as err:
            raise click.BadParameter(str(err), param_hint="--policy") from None
        target = (pod_ns or namespace, pod_name, settings)
    try:
        result = asyncio.run(_fetch(kubeconfig, context, memory_unit, target))
    except PodNotFound as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(1)
    except KubeError as err:
        click.echo(f"error: {err}", err=True)
        click.echo(
            "hint: check that the cluster is up and that KUBECONFIG, --kubeconfig or "
            "--context point at it",
            err=True,
        )
        sys.exit(1)
    if isinstance(result, Explanation):
        click.echo(render_explained(result, output=output), nl=False)
    else:
        click.echo(render(result, details=details, output=output), nl=False)
