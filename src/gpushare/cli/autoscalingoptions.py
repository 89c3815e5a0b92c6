"""The extender's flags for autoscaled GPU pools (docs/autoscaling.md), and their settings.

Off by default in the binary, so a process started by hand writes nothing it was not asked
to; the chart turns them on (``autoscaling.enabled``) with the release namespace and the
Lease its kube-scheduler holds.
"""

from __future__ import annotations

import socket
from typing import Any

import click

from gpushare.cli.errors import CommandError
from gpushare.cli.options import option_group
from gpushare.core.autoscaling.placeholders import PAUSE_IMAGE, PlaceholderSettings
from gpushare.core.autoscaling.scaledown import THRESHOLD
from gpushare.core.decision.scheduling import Settings
from gpushare.extender.autoscaling import AutoscalingSettings
from gpushare.extender.leadership import Leadership

autoscaling_options = option_group(
    click.option(
        "--placeholder-namespace",
        default="",
        help="Keep placeholder pods in this namespace (the release's), so cluster-autoscaler "
        "and Karpenter add a node for GPU pods no existing GPU holds; '' makes none.",
    ),
    click.option(
        "--placeholder-limit",
        type=click.IntRange(min=0),
        default=64,
        show_default=True,
        help="At most this many placeholder pods (one per GPU asked for) at once.",
    ),
    click.option(
        "--placeholder-per-namespace",
        type=click.IntRange(min=0),
        default=16,
        show_default=True,
        help="At most this many refused pods of one namespace are planned per round.",
    ),
    click.option(
        "--placeholder-image",
        default=PAUSE_IMAGE,
        show_default=True,
        help="The image placeholder pods name (never pulled: they are never bound).",
    ),
    click.option(
        "--placeholder-exclusion",
        type=click.Choice(["hostname", "label"]),
        default="hostname",
        show_default=True,
        help="How placeholders keep off the existing nodes: hostname (the node name, "
        "matchFields metadata.name NotIn, for cluster-autoscaler) or label "
        "(gpushare.io/gpus-published DoesNotExist, for Karpenter, which ignores pods naming "
        "kubernetes.io/hostname).",
    ),
    click.option(
        "--new-node-gpu-memory-mib",
        type=click.IntRange(min=0),
        default=0,
        show_default=True,
        help="GPU memory (MiB) of one GPU of the nodes your pools add, for pods refused before "
        "any node of their pool was seen; 0 leaves those to the autoscaler's own estimate.",
    ),
    click.option(
        "--scale-down-guard/--no-scale-down-guard",
        default=False,
        show_default=True,
        help="Annotate GPU nodes the autoscalers must not remove (GPUs used at or above "
        "--scale-down-threshold, or pods that fit nowhere else GPU by GPU).",
    ),
    click.option(
        "--scale-down-threshold",
        type=click.FloatRange(min=0, min_open=True, max=1),
        default=THRESHOLD,
        show_default=True,
        help="GPU memory used at or above this share keeps a node (cluster-autoscaler's "
        "--scale-down-utilization-threshold default).",
    ),
    click.option(
        "--leader-lease",
        default="",
        help="The Lease kube-scheduler leads with: only the replica whose kube-scheduler "
        "holds it runs the autoscaling loop and DRA mode's allocator; '' when there is one "
        "replica.",
    ),
    click.option(
        "--leader-lease-namespace",
        default="",
        help="The namespace of --leader-lease (the release's); '' means --placeholder-namespace.",
    ),
    click.option(
        "--autoscaling-period",
        type=click.FloatRange(min=0.1),
        default=5.0,
        show_default=True,
        help="Seconds between rounds.",
    ),
)
"""Add the autoscaling flags (``autoscaling_settings`` reads them)."""


def leadership(flags: dict[str, Any]) -> Leadership:
    """Which Lease says this replica leads (``--leader-lease`` in its namespace)."""
    lease = str(flags["leader_lease"])
    namespace = str(flags["leader_lease_namespace"] or flags["placeholder_namespace"])
    if lease and not namespace:
        raise CommandError(
            f"--leader-lease={lease!r} needs --leader-lease-namespace (or "
            "--placeholder-namespace): the Lease is read in the release namespace; give it, "
            "or leave --leader-lease out with one replica"
        )
    # kube-scheduler names the Lease's holder os.Hostname() + "_" + a UUID (k8s v1.36
    # cmd/kube-scheduler/app/server.go); the extender shares its container's UTS namespace,
    # so the same hostname is the pod's name, or the node's under hostNetwork.
    return Leadership(lease, namespace, socket.gethostname())


def autoscaling_settings(settings: Settings, flags: dict[str, Any]) -> AutoscalingSettings | None:
    """The loop's settings from the flags; None when it has nothing to do."""
    namespace = str(flags["placeholder_namespace"])
    guard = bool(flags["scale_down_guard"])
    leader = leadership(flags)
    if not namespace and not guard:
        return None
    placeholders = (
        PlaceholderSettings(
            namespace=namespace,
            limit=int(flags["placeholder_limit"]),
            per_namespace=int(flags["placeholder_per_namespace"]),
            new_node_gpu_mib=int(flags["new_node_gpu_memory_mib"]),
            image=str(flags["placeholder_image"]),
            exclusion=str(flags["placeholder_exclusion"]),
            names=settings.names,
            unit=settings.unit,
        )
        if namespace
        else None
    )
    return AutoscalingSettings(
        placeholders=placeholders,
        guard=guard,
        threshold=float(flags["scale_down_threshold"]),
        lease=leader.lease,
        lease_namespace=leader.namespace,
        identity=leader.identity,
        period_s=float(flags["autoscaling_period"]),
    )
