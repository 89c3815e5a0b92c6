"""``kubectl-inspect-cgpu``: the kubectl plugin (``kubectl inspect cgpu``).

It lists nodes and pods once, rebuilds the ledger from pod annotations exactly as the extender
does, and prints the view. It reads ``$KUBECONFIG`` like kubectl, and also takes
``--kubeconfig`` and ``--context``. The gpu-mem unit comes from the nodes themselves
(``core.inventory.declared_unit``); ``--unit`` only overrides it. ``-o json`` prints the
documents of ``inspect.schema``, whose JSON Schema ``--schema`` prints.

Like the extender it counts only allocations gpushare sealed for their pod (core.trust). The
key comes from ``--seal-key-file``, or from the Secret the chart creates (``--seal-secret``,
read through the API). A user who may not read that Secret gets one line on stderr saying so,
and a view built on the structural checks alone (node and requests), which a forged record that
matches its own pod's request passes.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import replace
from pathlib import Path

import click

from gpushare.core.gpuuse import read_used
from gpushare.core.inventory import declared_unit, read_node
from gpushare.core.kubejson import annotations_of, name_of, namespace_of
from gpushare.core.ledger import Ledger
from gpushare.core.policybook import recorded_units
from gpushare.core.scheduling import Scheduler, Settings
from gpushare.core.trust import Trust
from gpushare.core.units import MemoryUnit
from gpushare.inspect.explain import Explanation, explain_pod, explanation_json
from gpushare.inspect.render import render_details, render_explanation, render_summary
from gpushare.inspect.schema import DOCUMENTS, json_schema
from gpushare.inspect.view import ClusterView, build_view, to_json
from gpushare.kube.port import KubeAPI, KubeError
from gpushare.kube.sealing import (
    DEFAULT_SECRET,
    SealKeyError,
    load_key_file,
    parse_secret_ref,
    secret_key,
)


async def find_trust(
    api: KubeAPI, *, secret: str = DEFAULT_SECRET, key_file: str | None = None
) -> tuple[Trust, str]:
    """How to judge allocations, and a note when only their structure can be checked.

    Raises SealKeyError when an explicit ``key_file`` cannot be read.
    """
    if key_file:
        return Trust.sealed(load_key_file(Path(key_file))), ""
    namespace, name = parse_secret_ref(secret)
    key = await secret_key(api, namespace, name)
    if isinstance(key, str):
        return Trust.structural(), (
            f"note: {key}; checking allocations' structure only (node and requests), not their "
            f"seals (give --seal-key-file or --seal-secret)"
        )
    return Trust.sealed(key), ""


async def collect(
    api: KubeAPI,
    *,
    unit: MemoryUnit | None = None,
    trust: Trust | None = None,
    notes: list[str] | None = None,
) -> ClusterView:
    """List nodes and pods through the port and build the view.

    Without ``trust`` the key is read from the default Secret, else structure only. Without
    ``unit`` it is the one the nodes declare; a note on that goes to ``notes``.
    """
    if trust is None:
        trust, _ = await find_trust(api)
    nodes, _ = await api.list_nodes()
    pods, _ = await api.list_pods()
    if unit is None:
        unit, note = declared_unit(nodes)
        if note and notes is not None:
            notes.append(note)
    ledger = Ledger.from_pods(pods, unit=unit, trust=trust)
    inventories = (read_node(n, cluster_unit=unit) for n in nodes)
    used = {name_of(n): read_used(annotations_of(n)) for n in nodes}
    return build_view(inventories, ledger, unit=unit, units=recorded_units(pods), used=used)


class PodNotFound(KubeError):
    """The pod to explain is not in the cluster."""


async def collect_explanation(
    api: KubeAPI,
    namespace: str,
    name: str,
    *,
    settings: Settings,
    trust: Trust | None = None,
    find_unit: bool = False,
    notes: list[str] | None = None,
) -> Explanation:
    """List nodes and pods, rebuild the ledger and run the extender's filter for one pod.

    With ``find_unit`` the unit in ``settings`` is replaced by the one the nodes declare.
    """
    if trust is None:
        trust, _ = await find_trust(api)
    nodes, _ = await api.list_nodes()
    pods, _ = await api.list_pods()
    if find_unit:
        unit, note = declared_unit(nodes, default=settings.unit)
        settings = replace(settings, unit=unit)
        if note and notes is not None:
            notes.append(note)
    found = [p for p in pods if namespace_of(p) == namespace and name_of(p) == name]
    if not found:
        raise PodNotFound(f"pod {namespace}/{name} not found")
    ledger = Ledger.from_pods(pods, names=settings.names, unit=settings.unit, trust=trust)
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
    unit: MemoryUnit | None,
    explain: tuple[str, str, Settings] | None = None,
    *,
    seal_secret: str = DEFAULT_SECRET,
    seal_key_file: str | None = None,
) -> tuple[ClusterView | Explanation, list[str]]:
    """The view or explanation, and the notes made on the way (shown only on success)."""
    from gpushare.kube.lightkube_api import LightkubeAPI

    api = LightkubeAPI.connect(kubeconfig, context)
    try:
        trust, note = await find_trust(api, secret=seal_secret, key_file=seal_key_file)
        notes = [note] if note else []
        if explain is not None:
            explained = await collect_explanation(
                api,
                explain[0],
                explain[1],
                settings=explain[2],
                trust=trust,
                find_unit=unit is None,
                notes=notes,
            )
            return explained, notes
        return await collect(api, unit=unit, trust=trust, notes=notes), notes
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
    "--seal-secret",
    default=DEFAULT_SECRET,
    show_default=True,
    metavar="NAMESPACE/NAME",
    help="The Secret holding gpushare's seal key (the chart's gpushare-seal), read through the "
    "API; without access, only the allocations' structure is checked.",
)
@click.option(
    "--seal-key-file",
    default=None,
    help="Read the seal key from this file instead of the Secret.",
)
@click.option(
    "--unit",
    default=None,
    help="gpuMemoryUnit (1GiB or 128MiB) for nodes that do not declare theirs. Default: the "
    "unit the nodes declare (gpushare.io/gpu-mem-unit), else 1GiB.",
)
@click.option(
    "--schema",
    type=click.Choice(sorted(DOCUMENTS)),
    default=None,
    help="Print the JSON Schema of the -o json output (summary: the table and -d; explain: "
    "--explain) and exit.",
)
def main(
    details: bool,
    output: str,
    explain: str | None,
    namespace: str,
    policy: str,
    kubeconfig: str | None,
    context: str | None,
    seal_secret: str,
    seal_key_file: str | None,
    unit: str | None,
    schema: str | None,
) -> None:
    """Show how much GPU memory each node's GPUs have allocated, or explain one pod."""
    if schema is not None:
        click.echo(json.dumps(json_schema(schema), indent=2, sort_keys=True))
        return
    try:
        memory_unit = MemoryUnit.parse(unit) if unit is not None else None
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--unit") from None
    try:
        parse_secret_ref(seal_secret)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--seal-secret") from None
    target: tuple[str, str, Settings] | None = None
    if explain is not None:
        pod_ns, _, pod_name = explain.rpartition("/")
        if not pod_name:
            raise click.BadParameter(f"{explain!r}: write NAMESPACE/POD or POD", param_hint="-e")
        settings = Settings(unit=memory_unit or MemoryUnit.GiB, policy=policy)
        try:
            Scheduler(settings)
        except (KeyError, ValueError) as err:
            raise click.BadParameter(str(err), param_hint="--policy") from None
        target = (pod_ns or namespace, pod_name, settings)
    try:
        result, notes = asyncio.run(
            _fetch(
                kubeconfig,
                context,
                memory_unit,
                target,
                seal_secret=seal_secret,
                seal_key_file=seal_key_file,
            )
        )
    except SealKeyError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(2)
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
    for note in notes:
        click.echo(note, err=True)
    if isinstance(result, Explanation):
        click.echo(render_explained(result, output=output), nl=False)
    else:
        click.echo(render(result, details=details, output=output), nl=False)
