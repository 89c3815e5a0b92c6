"""``kubectl-inspect-cgpu``: the kubectl plugin (``kubectl inspect cgpu``).

It lists nodes and pods once, rebuilds the ledger from pod annotations exactly as the extender
does, and prints the view. It reads ``$KUBECONFIG`` like kubectl, and also takes
``--kubeconfig`` and ``--context``. The gpu-mem unit comes from the nodes themselves
(``core.model.inventory.declared_unit``); ``--unit`` only overrides it. ``-o json`` prints the
documents of ``inspect.schema``, whose JSON Schema ``--schema`` prints.

Its flags follow kubectl's: ``-n``, ``-A``, ``-l`` choose the pods shown (``inspect.scope``),
``-o text|wide|json|yaml`` and ``--no-headers`` the rendering; without them the output is the
seeds'. It asks for no more than it needs, and takes less when refused: a user who may not list
every namespace's pods gets the context's namespace (or ``-n``'s), one who may not list nodes
gets them as the pods describe them, each with a note in the output, never a traceback.
``--explain`` needs the whole cluster and says so in one line when it cannot have it; it scores
with the installed extender's settings (``inspect.installed``), read from its Deployment.

In DRA mode (docs/dra.md) it also lists gpushare's ResourceSlices and the ResourceClaims where
it listed pods, and shows DRA nodes and claims' holdings the same way (``inspect.dramode``); a
user who may not list slices gets DRA nodes as its claims describe them. ``--explain`` covers
device-plugin nodes only, and says so for a DRA pod or a cluster with DRA nodes.

Like the extender it counts only allocations gpushare sealed for their pod (core.records.trust). The
key comes from ``--seal-key-file``, or from the Secret the chart creates (``--seal-secret``,
read through the API). A user who may not read that Secret gets one line on stderr saying so,
and a view built on the structural checks alone (node and requests), which a forged record that
matches its own pod's request passes.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import click
import yaml

from gpushare.core.decision.clusterstate import ClusterState
from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.core.model.inventory import declared_unit, read_node
from gpushare.core.model.kubejson import annotations_of, labels_of, name_of, namespace_of
from gpushare.core.model.names import ALLOCATION_MODE_DRA, DRA_CLAIM_NAME, LABEL_ALLOCATION_MODE
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.gpuuse import read_used
from gpushare.core.records.trust import Trust
from gpushare.core.resourcepolicies.policybook import recorded_units
from gpushare.inspect.choices import complete_contexts, complete_namespaces, complete_pods
from gpushare.inspect.dramode import DraView, read_dra
from gpushare.inspect.explain import Explanation, explain_pod, explanation_json
from gpushare.inspect.installed import (
    describe,
    extender_settings,
    placeholder_namespace,
    seal_secret,
)
from gpushare.inspect.newnode import PlaceholderSight
from gpushare.inspect.render import Layout, render_details, render_explanation, render_summary
from gpushare.inspect.schema import DOCUMENTS, json_schema
from gpushare.inspect.scope import (
    EVERY_POD,
    Scope,
    Sight,
    nodes_from_pods,
    parse_selector,
    selected_uids,
)
from gpushare.inspect.view import ClusterView, build_view, to_json
from gpushare.kube.port import DraAPI, Forbidden, KubeAPI, KubeDict, KubeError
from gpushare.kube.sealing import (
    DEFAULT_SECRET,
    SealKeyError,
    load_key_file,
    parse_secret_ref,
    secret_key,
)

DEFAULT_EXTENDER_NAMESPACE = "gpushare"
"""The namespace the chart is installed into by default (that of ``--seal-secret``'s default)."""


class InspectAPI(KubeAPI, DraAPI, Protocol):
    """What the plugin reads: nodes, pods, Secrets and Deployments, and DRA objects."""


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


async def installed_seal_secret(api: KubeAPI, namespace: str) -> str:
    """The Secret the installed extender mounts its seal key from (``inspect.installed``), else
    the chart's under the default release name (``DEFAULT_SECRET``)."""
    try:
        found = seal_secret(await api.list_deployments(namespace), namespace)
    except KubeError:
        found = None
    return found or DEFAULT_SECRET


async def read_cluster(
    api: KubeAPI, *, home: str = ""
) -> tuple[list[KubeDict] | None, list[KubeDict], Sight]:
    """Nodes (None when forbidden), the pods the user may list, and what was hidden.

    Pods of every namespace when allowed; when not, those of ``home`` (a namespace), and a
    Forbidden when there is no ``home`` to fall back to.
    """
    try:
        nodes: list[KubeDict] | None = (await api.list_nodes())[0]
    except Forbidden:
        nodes = None
    try:
        pods, _ = await api.list_pods()
        return nodes, pods, Sight(nodes=nodes is not None)
    except Forbidden:
        if not home:
            raise
    pods, _ = await api.list_pods(namespace=home)
    return nodes, pods, Sight(nodes=nodes is not None, pods_namespace=home)


@dataclass(frozen=True)
class DraObjects:
    """The DRA objects the user may list (``read_dra_objects``)."""

    slices: list[KubeDict] | None
    """gpushare's ResourceSlices; None when forbidden."""
    claims: list[KubeDict]
    claims_forbidden: bool = False


async def read_dra_objects(api: DraAPI, *, namespace: str = "") -> DraObjects:
    """gpushare's ResourceSlices and the ResourceClaims of every namespace (or of
    ``namespace``, where the user's pods were listed).

    Forbidden is noted, not raised (a tenant may list neither); any other error, such as a
    cluster without ``resource.k8s.io/v1`` (404), is a cluster without DRA mode.
    """
    slices: list[KubeDict] | None
    try:
        slices = (await api.list_resource_slices())[0]
    except Forbidden:
        slices = None
    except KubeError:
        slices = []
    try:
        claims = (await api.list_resource_claims(namespace))[0]
    except Forbidden:
        return DraObjects(slices, [], claims_forbidden=True)
    except KubeError:
        claims = []
    return DraObjects(slices, claims)


def dra_sight(sight: Sight, objects: DraObjects, dra: DraView) -> Sight:
    """``sight`` with what DRA mode hid: a note on slices only where claims showed DRA mode,
    on claims only where slices did, so a device-plugin cluster's view is unchanged."""
    return replace(
        sight,
        slices=objects.slices is not None or not dra.ledger.holdings,
        claims=not (objects.claims_forbidden and bool(objects.slices)),
    )


async def collect(
    api: InspectAPI,
    *,
    unit: MemoryUnit | None = None,
    trust: Trust | None = None,
    notes: list[str] | None = None,
    scope: Scope = EVERY_POD,
    home: str = "",
) -> ClusterView:
    """List nodes and pods through the port and build the view of the pods in ``scope``.

    Without ``trust`` the key is read from the default Secret, else structure only. Without
    ``unit`` it is the one the nodes declare; a note on that goes to ``notes``. A user who may
    not list every namespace's pods gets ``home``'s (``read_cluster``), and one who may not
    list nodes gets them described from the pods (``scope.nodes_from_pods``).
    """
    if trust is None:
        trust, _ = await find_trust(api)
    nodes, pods, sight = await read_cluster(api, home=home)
    objects = await read_dra_objects(api, namespace=sight.pods_namespace)
    if sight.pods_namespace:
        scope = replace(scope, namespace=sight.pods_namespace)
    if unit is None:
        unit, note = declared_unit(nodes or [])
        if note and notes is not None:
            notes.append(note)
    if nodes is None:
        inventories = nodes_from_pods(pods)
        used = {}
    else:
        inventories = [read_node(n, cluster_unit=unit) for n in nodes]
        used = {name_of(n): read_used(annotations_of(n)) for n in nodes}
    dra: DraView | None = read_dra(objects.slices, objects.claims, nodes, unit=unit)
    if dra is not None and dra.present:
        inventories = dra.merge(inventories)
        sight = dra_sight(sight, objects, dra)
    else:
        dra = None
    # the state the extender's cache and ``--explain`` build from one list
    state = ClusterState.listed(
        settings=Settings(unit=unit), trust=trust, nodes=inventories, pods=pods
    )
    if dra is not None:
        dra.book(state.ledger)
    return build_view(
        state.nodes.values(),
        state.ledger,
        unit=unit,
        units=recorded_units(pods),
        scope=scope,
        selected=selected_uids(pods, scope),
        sight=sight,
        used=used,
        dra=dra,
    )


def is_dra_node(node: KubeDict) -> bool:
    """Whether the node is labelled for DRA mode (``gpushare.io/allocation-mode=dra``)."""
    return labels_of(node).get(LABEL_ALLOCATION_MODE) == ALLOCATION_MODE_DRA


def uses_dra_claim(pod: KubeDict) -> bool:
    """Whether the pod takes its GPUs from gpushare's ResourceClaim (DRA mode)."""
    entries = (pod.get("spec") or {}).get("resourceClaims") or []
    return any(isinstance(e, dict) and e.get("name") == DRA_CLAIM_NAME for e in entries)


class PodNotFound(KubeError):
    """The pod to explain is not in the cluster."""


class CannotExplain(KubeError):
    """The user may not read what ``--explain`` needs (every node and every pod)."""


@dataclass(frozen=True)
class Installed:
    """What ``--explain`` read of the installed extender."""

    settings: Settings
    note: str
    placeholders: PlaceholderSight
    """Where its placeholder pods are (``inspect.newnode``), or a guess when unread."""


async def installed_extender(api: KubeAPI, namespace: str) -> Installed:
    """The installed extender's settings (``inspect.installed``) and where it keeps
    placeholders, with a note; the extender's defaults stand in when they cannot be read."""
    guess = PlaceholderSight(namespace=namespace, known=False)
    try:
        deployments = await api.list_deployments(namespace)
        settings, where = extender_settings(deployments, namespace)
    except (KubeError, ValueError) as err:
        settings = Settings()
        return Installed(
            settings,
            f"note: cannot read the installed extender's settings ({err}); explaining with the "
            f"extender's defaults ({describe(settings)}); give --policy, or "
            f"--extender-namespace where gpushare is installed",
            guess,
        )
    found = placeholder_namespace(deployments)
    sight = guess if found is None else PlaceholderSight(namespace=found)
    return Installed(
        settings, f"note: explaining with the settings of {where} ({describe(settings)})", sight
    )


async def installed_settings(api: KubeAPI, namespace: str) -> tuple[Settings, str]:
    """The installed extender's settings (``inspect.installed``), and a note when they could
    not be read and the extender's defaults stand in."""
    installed = await installed_extender(api, namespace)
    return installed.settings, installed.note


async def collect_explanation(
    api: KubeAPI,
    namespace: str,
    name: str,
    *,
    settings: Settings,
    trust: Trust | None = None,
    find_unit: bool = False,
    notes: list[str] | None = None,
    placeholders: PlaceholderSight | None = None,
) -> Explanation:
    """List nodes and pods, rebuild the ledger and run the extender's filter for one pod.

    With ``find_unit`` the unit in ``settings`` is replaced by the one the nodes declare; with
    ``placeholders`` a pod no node fits is told whether a new node is asked for.
    """
    if trust is None:
        trust, _ = await find_trust(api)
    try:
        nodes, _ = await api.list_nodes()
        pods, _ = await api.list_pods()
    except Forbidden as err:
        raise CannotExplain(
            f"cannot explain {namespace}/{name}: {err}; --explain runs the extender's filter, "
            f"which needs every node and every pod (a cluster-wide right to list them); "
            f"without it, `kubectl inspect cgpu -n {namespace}` shows what your pods hold"
        ) from None
    if find_unit:
        unit, note = declared_unit(nodes, default=settings.unit)
        settings = replace(settings, unit=unit)
        if note and notes is not None:
            notes.append(note)
    found = [p for p in pods if namespace_of(p) == namespace and name_of(p) == name]
    if not found:
        raise PodNotFound(f"pod {namespace}/{name} not found")
    if uses_dra_claim(found[0]):
        raise CannotExplain(
            f"cannot explain {namespace}/{name}: it is in DRA mode (its GPUs come from its "
            f"ResourceClaim {DRA_CLAIM_NAME!r}); --explain covers device-plugin nodes only: see "
            f"the pod's Events (DRAAllocated, DRANoFit) and `kubectl inspect cgpu -d`"
        )
    dra_nodes = sorted(name_of(n) for n in nodes if is_dra_node(n))
    if dra_nodes and notes is not None:
        notes.append(
            f"note: --explain covers device-plugin nodes only; {len(dra_nodes)} DRA node(s) "
            f"({', '.join(dra_nodes[:3])}{', ...' if len(dra_nodes) > 3 else ''}) are not "
            "scored (docs/dra.md, limits)"
        )
    inventories = [read_node(n, cluster_unit=settings.unit, names=settings.names) for n in nodes]
    state = ClusterState.listed(settings=settings, trust=trust, nodes=inventories, pods=pods)
    sight = placeholders.seeing(pods) if placeholders is not None else None
    return explain_pod(found[0], state, Scheduler(settings), placeholders=sight)


OUTPUTS = ("text", "wide", "json", "yaml")
"""``-o``'s values: kubectl's table, its wide table, and the documents of ``inspect.schema``."""


def _document(data: dict[str, object], output: str) -> str:
    if output == "yaml":
        return yaml.safe_dump(data, sort_keys=True, default_flow_style=False)
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def render_explained(explanation: Explanation, *, output: str, headers: bool = True) -> str:
    """The chosen rendering of an explanation."""
    if output in ("json", "yaml"):
        return _document(explanation_json(explanation), output)
    return render_explanation(explanation, Layout(headers=headers, wide=output == "wide"))


def render(view: ClusterView, *, details: bool, output: str, headers: bool = True) -> str:
    """The chosen rendering of a view."""
    if output in ("json", "yaml"):
        return _document(to_json(view), output)
    layout = Layout(headers=headers, wide=output == "wide")
    return render_details(view, layout) if details else render_summary(view, layout)


@dataclass(frozen=True)
class Query:
    """What the command line asks for, checked."""

    unit: MemoryUnit | None = None
    scope: Scope = EVERY_POD
    all_namespaces: bool = False
    """``-A``: every namespace's pods, and an error (not a fallback) when that is forbidden."""
    explain: tuple[str, str] | None = None
    """``--explain``'s pod: (namespace, name); an empty namespace is the context's."""
    policy: str | None = None
    """``--policy``; None: the installed extender's."""
    extender_namespace: str = DEFAULT_EXTENDER_NAMESPACE
    seal_secret: str | None = None
    """``NAMESPACE/NAME``; None: the one the installed extender mounts, else DEFAULT_SECRET."""
    seal_key_file: str | None = None


async def _explain(
    api: KubeAPI, query: Query, trust: Trust, notes: list[str], *, home: str
) -> Explanation:
    """``--explain``, with the installed extender's settings unless ``--policy`` is given."""
    assert query.explain is not None
    pod_ns, pod_name = query.explain
    installed = await installed_extender(api, query.extender_namespace)
    if query.policy is None:
        settings = installed.settings
        notes.append(installed.note)
    else:
        settings = Settings(policy=query.policy)
    if query.unit is not None:
        settings = replace(settings, unit=query.unit)
    return await collect_explanation(
        api,
        pod_ns or home,
        pod_name,
        settings=settings,
        trust=trust,
        find_unit=query.unit is None,
        notes=notes,
        placeholders=installed.placeholders,
    )


async def _fetch(
    kubeconfig: str | None, context: str | None, query: Query
) -> tuple[ClusterView | Explanation, list[str]]:
    """The view or explanation, and the notes made on the way (shown only on success)."""
    from gpushare.kube.lightkube_api import LightkubeAPI

    api = LightkubeAPI.connect(kubeconfig, context)
    try:
        secret = query.seal_secret
        if secret is None and query.seal_key_file is None:
            secret = await installed_seal_secret(api, query.extender_namespace)
        trust, note = await find_trust(
            api, secret=secret or DEFAULT_SECRET, key_file=query.seal_key_file
        )
        notes = [note] if note else []
        if query.explain is not None:
            return await _explain(api, query, trust, notes, home=api.namespace), notes
        home = "" if query.all_namespaces else (query.scope.namespace or api.namespace)
        view = await collect(
            api, unit=query.unit, trust=trust, notes=notes, scope=query.scope, home=home
        )
        return view, notes
    except (PodNotFound, CannotExplain):
        raise
    except Forbidden as err:
        raise Forbidden(
            f"{err}: ask for a Role that lets you list pods in a namespace, and give it with -n "
            f"(see docs/inspect.md, 'A tenant's view')"
        ) from None
    except KubeError as err:
        raise KubeError(f"cannot read from the Kubernetes API at {api.server}: {err}") from None
    finally:
        await api.close()


def _check(query: Query, *, explain: str | None, policy: str | None) -> Query:
    """Refuse what cannot be asked, naming the option; ``query`` with --explain's pod."""
    if explain is not None:
        pod_ns, _, pod_name = explain.rpartition("/")
        if not pod_name:
            raise click.BadParameter(f"{explain!r}: write NAMESPACE/POD or POD", param_hint="-e")
        query = replace(query, explain=(pod_ns or query.scope.namespace, pod_name))
    if policy is not None:
        try:
            Scheduler(Settings(policy=policy))
        except (KeyError, ValueError) as err:
            raise click.BadParameter(str(err), param_hint="--policy") from None
    return query


@click.command(name="kubectl-inspect-cgpu")
@click.option("-d", "--details", is_flag=True, help="Show each node's pods and their GPUs.")
@click.option(
    "-o",
    "--output",
    type=click.Choice(OUTPUTS),
    default="text",
    show_default=True,
    help="text: the seeds' table; wide: with each node's mode and pods; json or yaml: the "
    "documents of --schema.",
)
@click.option(
    "-n",
    "--namespace",
    default=None,
    shell_complete=complete_namespaces,
    help="Only this namespace's pods, and the nodes they are on. Default: every namespace, or "
    "the kubeconfig context's namespace when you may not list pods cluster-wide; --explain's "
    "POD is in the context's namespace.",
)
@click.option(
    "-A",
    "--all-namespaces",
    is_flag=True,
    help="Every namespace's pods (the default where allowed; with -A, an error where not).",
)
@click.option(
    "-l",
    "--selector",
    default="",
    help="Only pods matching this label selector (key=value, key!=value, 'key in (a,b)', "
    "key, !key; joined by commas), and the nodes they are on.",
)
@click.option("--no-headers", is_flag=True, help="Print tables without their header row.")
@click.option(
    "-e",
    "--explain",
    metavar="[NAMESPACE/]POD",
    default=None,
    shell_complete=complete_pods,
    help="Say, node by node, whether this pod would fit now and why not (a what-if).",
)
@click.option(
    "--policy",
    default=None,
    help="--explain: score as this policy. Default: the installed extender's settings (its "
    "Deployment's flags in --extender-namespace), else the extender's defaults.",
)
@click.option(
    "--extender-namespace",
    default=DEFAULT_EXTENDER_NAMESPACE,
    show_default=True,
    help="Where gpushare's chart is installed, for --explain to read the extender's settings "
    "and to find the seal key's Secret.",
)
@click.option(
    "--kubeconfig",
    envvar=None,
    type=click.Path(dir_okay=False),
    help="Path to a kubeconfig (default: $KUBECONFIG).",
)
@click.option("--context", shell_complete=complete_contexts, help="The kubeconfig context to use.")
@click.option(
    "--seal-secret",
    default=None,
    metavar="NAMESPACE/NAME",
    help="The Secret holding gpushare's seal key, read through the API; without access, only "
    "the allocations' structure is checked. Default: the Secret the extender Deployment in "
    f"--extender-namespace mounts (the chart's <release>-seal), else {DEFAULT_SECRET}.",
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
    help="Print the JSON Schema of the -o json/yaml output (summary: the table and -d; "
    "explain: --explain) and exit.",
)
def main(
    details: bool,
    output: str,
    namespace: str | None,
    all_namespaces: bool,
    selector: str,
    no_headers: bool,
    explain: str | None,
    policy: str | None,
    extender_namespace: str,
    kubeconfig: str | None,
    context: str | None,
    seal_secret: str | None,
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
        if seal_secret is not None:
            parse_secret_ref(seal_secret)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--seal-secret") from None
    try:
        labels = parse_selector(selector)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="-l") from None
    query = Query(
        unit=memory_unit,
        scope=Scope(namespace="" if all_namespaces else (namespace or ""), selector=labels),
        all_namespaces=all_namespaces,
        policy=policy,
        extender_namespace=extender_namespace,
        seal_secret=seal_secret,
        seal_key_file=seal_key_file,
    )
    query = _check(query, explain=explain, policy=policy)
    try:
        result, notes = asyncio.run(_fetch(kubeconfig, context, query))
    except SealKeyError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(2)
    except (PodNotFound, CannotExplain, Forbidden) as err:
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
        click.echo(render_explained(result, output=output, headers=not no_headers), nl=False)
    else:
        text = render(result, details=details, output=output, headers=not no_headers)
        click.echo(text, nl=False)
