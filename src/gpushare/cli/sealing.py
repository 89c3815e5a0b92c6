"""The seal key: ``gpushare seal-key`` makes one, and the components' flags that load it.

The extender seals every allocation it binds and every device plugin checks the seal, so both
take the same ``--seal-key-file``; neither starts without one unless told in so many words
(``--insecure-no-seal``, for tests), because an unsealed allocation is one any tenant who can
create a pod with ``spec.nodeName`` could write.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from gpushare.cli.errors import CommandError
from gpushare.cli.options import option_group

if TYPE_CHECKING:
    from gpushare.core.records.trust import Trust


seal_options = option_group(
    click.option(
        "--seal-key-file",
        default=None,
        help="The key that seals allocations (gpushare.io/seal); the same file for the extender "
        "and every device plugin. Make one with `gpushare seal-key > seal.key`.",
    ),
    click.option(
        "--insecure-no-seal",
        is_flag=True,
        help="Run without a seal key: allocations are checked for structure only, so a tenant "
        "who creates a pod with spec.nodeName and a matching gpushare.io/allocation is counted "
        "and served. For tests only.",
    ),
)
"""Add ``--seal-key-file`` and ``--insecure-no-seal``."""


def trust_from_flags(seal_key_file: str | None, insecure_no_seal: bool) -> Trust:
    """The ``Trust`` the flags ask for; a CommandError says how to make a key."""
    from pathlib import Path

    from gpushare.core.records.trust import Trust
    from gpushare.kube.sealing import HOW_TO_MAKE, SealKeyError, load_key_file

    if seal_key_file and insecure_no_seal:
        raise CommandError("give --seal-key-file or --insecure-no-seal, not both")
    if insecure_no_seal:
        click.echo(
            "warning: --insecure-no-seal: allocations are not sealed or checked for a seal; "
            "any tenant who can create a pod with spec.nodeName and a gpushare.io/allocation "
            "matching its own request is counted and served",
            err=True,
        )
        return Trust.structural()
    if not seal_key_file:
        raise CommandError(f"no --seal-key-file given: {HOW_TO_MAKE}")
    try:
        return Trust.sealed(load_key_file(Path(seal_key_file)))
    except SealKeyError as err:
        raise CommandError(str(err)) from None


@click.command("seal-key")
@click.option(
    "--secret",
    default=None,
    metavar="NAMESPACE/NAME",
    help="Instead of printing a key, create this Secret with one unless it exists (the chart's "
    "seal Job); an existing Secret is kept as it is.",
)
@click.option(
    "--label",
    multiple=True,
    metavar="KEY=VALUE",
    help="With --secret: a label for the Secret it creates (repeatable).",
)
@click.option("--kubeconfig", default=None)
def seal_key(secret: str | None, label: tuple[str, ...], kubeconfig: str | None) -> None:
    """Print a new random seal key (for --seal-key-file), or create the seal Secret."""
    from gpushare.kube.sealing import new_key_text, parse_secret_ref

    if secret is None:
        click.echo(new_key_text())
        return
    import asyncio

    from gpushare.kube.lightkube_api import LightkubeAPI
    from gpushare.kube.port import KubeError
    from gpushare.kube.sealing import ensure_secret

    try:
        namespace, name = parse_secret_ref(secret)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--secret") from None
    labels = {}
    for item in label:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r}: write KEY=VALUE", param_hint="--label")
        labels[key] = value

    async def run() -> tuple[bool, str]:
        api = LightkubeAPI.connect(kubeconfig)
        try:
            return await ensure_secret(api, namespace, name, labels)
        finally:
            await api.close()

    try:
        fine, said = asyncio.run(run())
    except KubeError as err:
        raise CommandError(f"cannot make sure of the seal Secret {secret}: {err}") from None
    if not fine:
        raise CommandError(said)
    click.echo(said)
