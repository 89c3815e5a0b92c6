"""``gpushare check-hand-off``: run inside a GPU container, checks what the plugin handed over.

The adapter around ``node.containerproof``: it lists the container's ``/dev/nvidia*`` nodes and
whether ``/etc/gpushare/limits`` is there, hands them and the environment to the check, prints
its findings and exits 0 when the container got what the plugin promised, 1 naming what is
missing otherwise. The chart's ``helm test`` GPU pod runs it from the gpushare image.
"""

from __future__ import annotations

import os
from pathlib import Path

import click


@click.command("check-hand-off")
@click.option(
    "--no-control-device",
    is_flag=True,
    help="Do not ask for /dev/nvidiactl: fake GPUs (the chart's testing.fakeGpus) have no driver.",
)
@click.option("--dev", default="/dev", show_default=True, help="Where the device nodes are.")
def check_hand_off(no_control_device: bool, dev: str) -> None:
    """Inside a GPU container: check the device nodes and files the device plugin promised."""
    from gpushare.core.admitting.isolationpaths import CONTAINER_LIMITS_FILE
    from gpushare.node.containerproof import check

    root = Path(dev)
    try:
        nodes = [f"/dev/{p.name}" for p in root.iterdir() if p.name.startswith("nvidia")]
    except OSError as err:
        raise click.ClickException(f"cannot list {root}: {err}") from None
    present = [*nodes, *([CONTAINER_LIMITS_FILE] if Path(CONTAINER_LIMITS_FILE).exists() else [])]
    seen = check(dict(os.environ), present, control=not no_control_device)
    click.echo(seen.text())
    if not seen.ok:
        raise SystemExit(1)
