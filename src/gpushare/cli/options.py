"""The scheduling flags several commands share, and the one path from them to settings.

The extender, the webhook and the device plugin each take the memory unit, the pods per GPU and
the resource names; whatever flags and environment a command reads them from, it hands them to
:func:`scheduling_config`, which validates them with ``gpushare.config.load``, so every component
refuses the same values with the same message, and the chart, which passes them all the same
values, never starts one that reads them differently.
"""

from __future__ import annotations

from typing import Protocol

import click
from click.decorators import FC

from gpushare.cli.errors import CommandError
from gpushare.config import ConfigError, SchedulingConfig, load


class Decorator(Protocol):
    """A click option (or group of them), as a decorator."""

    def __call__(self, func: FC, /) -> FC: ...


def option_group(*options: Decorator) -> Decorator:
    """One decorator adding these click options, in the order given (the order --help shows)."""

    def add(func: FC, /) -> FC:
        for option in reversed(options):
            func = option(func)
        return func

    return add


scheduling_options = option_group(
    click.option(
        "--max-pods-per-gpu",
        type=int,
        default=None,
        help="Pods per GPU under isolation (default 20, or 16 at 128MiB).",
    ),
    click.option(
        "--policy",
        default=None,
        help="Node-level policy: gpushare (default, fragmentation-aware), binpack, spread or fgd.",
    ),
    click.option("--gpu-memory-unit", default=None, help="1GiB (default) or 128MiB."),
)
"""Add ``--gpu-memory-unit``, ``--policy`` and ``--max-pods-per-gpu`` (the extender's)."""


resource_name_options = option_group(
    click.option("--mem-resource", default=None, help="Default aliyun.com/gpu-mem."),
    click.option("--core-resource", default=None, help="Default aliyun.com/gpu-core.percentage."),
    click.option("--count-resource", default=None, help="Default aliyun.com/gpu-count."),
)
"""Add ``--mem-resource``, ``--core-resource`` and ``--count-resource``."""


def scheduling_config(**flags: object) -> SchedulingConfig:
    """The settings the flags give (None: the default); a CommandError says what is wrong."""
    try:
        return load(**flags)
    except ConfigError as err:
        raise CommandError(str(err)) from None
