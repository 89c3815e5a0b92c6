"""The scheduling flags several commands share, and the one path from them to settings.

The extender, the webhook and the device plugin each take the memory unit, the pods per GPU and
the resource names; whatever flags and environment a command reads them from, it hands them to
:func:`scheduling_config`, which validates them with ``gpushare.config.load``, so every component
refuses the same values with the same message, and the chart, which passes them all the same
values, never starts one that reads them differently.
"""

from __future__ import annotations

import click

from gpushare.cli.errors import CommandError
from gpushare.config import ConfigError, SchedulingConfig, load


def scheduling_options(func: click.decorators.FC) -> click.decorators.FC:
    """Add ``--gpu-memory-unit``, ``--policy`` and ``--max-pods-per-gpu`` (the extender's)."""
    func = click.option("--gpu-memory-unit", default=None, help="1GiB (default) or 128MiB.")(func)
    func = click.option(
        "--policy",
        default=None,
        help="Node-level policy: gpushare (default, fragmentation-aware), binpack, spread or fgd.",
    )(func)
    func = click.option(
        "--max-pods-per-gpu",
        type=int,
        default=None,
        help="Pods per GPU under isolation (default 20, or 16 at 128MiB).",
    )(func)
    return func


def resource_name_options(func: click.decorators.FC) -> click.decorators.FC:
    """Add ``--mem-resource``, ``--core-resource`` and ``--count-resource``."""
    func = click.option("--count-resource", default=None, help="Default aliyun.com/gpu-count.")(
        func
    )
    func = click.option(
        "--core-resource", default=None, help="Default aliyun.com/gpu-core.percentage."
    )(func)
    func = click.option("--mem-resource", default=None, help="Default aliyun.com/gpu-mem.")(func)
    return func


def scheduling_config(**flags: object) -> SchedulingConfig:
    """The settings the flags give (None: the default); a CommandError says what is wrong."""
    try:
        return load(**flags)
    except ConfigError as err:
        raise CommandError(str(err)) from None
