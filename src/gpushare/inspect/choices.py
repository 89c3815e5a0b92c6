"""The values ``kubectl inspect cgpu``'s options may take, offered by both ways of completing.

Values come from the kubeconfig (contexts, and the namespaces they name) and, for ``--explain``,
from the pods of the namespace; a failure to read them offers nothing rather than an error. The
command's options name these (``cli``); ``completion`` runs the command's completion for kubectl.
"""

from __future__ import annotations

import asyncio
from typing import Any

import click
from click.shell_completion import CompletionItem


def _contexts(ctx: click.Context) -> dict[str, str]:
    from gpushare.kube.lightkube_api import kubeconfig_contexts

    return kubeconfig_contexts(ctx.params.get("kubeconfig"))


def complete_contexts(ctx: click.Context, param: Any, incomplete: str) -> list[CompletionItem]:
    """``--context``: the kubeconfig's contexts."""
    return [CompletionItem(c) for c in sorted(_contexts(ctx)) if c.startswith(incomplete)]


def complete_namespaces(ctx: click.Context, param: Any, incomplete: str) -> list[CompletionItem]:
    """``-n``: the namespaces the kubeconfig's contexts name (no API call, no right needed)."""
    names = {ns for ns in _contexts(ctx).values() if ns} or {"default"}
    return [CompletionItem(n) for n in sorted(names) if n.startswith(incomplete)]


async def _pod_names(kubeconfig: str | None, context: str | None, namespace: str) -> list[str]:
    from gpushare.kube.lightkube_api import LightkubeAPI

    api = LightkubeAPI.connect(kubeconfig, context)
    try:
        pods, _ = await api.list_pods(namespace=namespace or api.namespace)
        return sorted(str(p["metadata"]["name"]) for p in pods)
    finally:
        await api.close()


def complete_pods(ctx: click.Context, param: Any, incomplete: str) -> list[CompletionItem]:
    """``--explain``: the pods of ``-n``'s namespace, else the context's."""
    from gpushare.kube.port import KubeError

    try:
        names = asyncio.run(
            _pod_names(
                ctx.params.get("kubeconfig"),
                ctx.params.get("context"),
                ctx.params.get("namespace") or "",
            )
        )
    except (KubeError, KeyError, TypeError, OSError):
        return []
    return [CompletionItem(n) for n in names if n.startswith(incomplete)]
