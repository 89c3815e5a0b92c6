"""``gpushare demo``: the seed walkthrough, on an in-memory cluster in this process."""

from __future__ import annotations

import click


@click.command()
def demo() -> None:
    """Run the seed walkthrough in one process, on an in-memory cluster."""
    from gpushare.demo import run_demo

    run_demo()
