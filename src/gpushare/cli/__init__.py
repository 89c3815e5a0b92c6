"""``gpushare``: the command-line entry point for every component.

One module per command or family, each a thin adapter: it reads flags, builds the component from
the packages below (the import-linter contract keeps ``gpushare.cli`` the top layer) and runs
it. What they share has one home each: the scheduling flags and the one path from them to
settings (``options``), the seal key flags (``sealing``), the logging setup of the long-running
commands (``logs``) and how a command refuses (``errors``).

- ``demo``: ``gpushare demo``, the seed walkthrough on an in-memory cluster.
- ``extender``: ``gpushare extender``, the kube-scheduler extender.
- ``deviceplugin``: ``gpushare device-plugin``, kubelet's device plugin on one node.
- ``dradriver``: ``gpushare dra-driver``, the DRA kubelet plugin on one node (DRA mode).
- ``checkhandoff``: ``gpushare check-hand-off``, run inside a GPU container (the chart's
  ``helm test`` pod): did it get the device nodes and files the plugin promised.
- ``webhook``: ``gpushare webhook`` and ``webhook-config``, the admission webhook and its
  configurations.
- ``scheduler``: ``gpushare scheduler-config``, kube-scheduler's configuration.
- ``sealing``: ``gpushare seal-key``, and the flags that load the seal key.
- ``simulate``: ``gpushare simulate``, the policy simulator.
- ``autoscalingoptions``: the extender's flags for autoscaled GPU pools.
- ``pluginoptions``: the device plugin's flags, validated into one value its builder takes.
- ``options``: the scheduling flags several commands share, and the one path to settings.
- ``scrapeaccess``: who may scrape ``/metrics``, the flags the extender and plugin share.
- ``logs``: the logging setup of the long-running commands.
- ``errors``: how a command says it cannot go on.

Imports that pull in a server, the API client or the simulator's extra stay inside each command,
so ``gpushare --help`` and the printing commands start fast and run without them.
"""

from __future__ import annotations

import click

from gpushare import __version__
from gpushare.cli.checkhandoff import check_hand_off
from gpushare.cli.demo import demo
from gpushare.cli.deviceplugin import device_plugin
from gpushare.cli.dradriver import dra_driver
from gpushare.cli.extender import extender
from gpushare.cli.scheduler import scheduler_config
from gpushare.cli.sealing import seal_key
from gpushare.cli.simulate import simulate
from gpushare.cli.webhook import webhook, webhook_config

__all__ = ["main"]


@click.group()
@click.version_option(__version__, prog_name="gpushare")
def main() -> None:
    """Shared GPU scheduling for Kubernetes (aliyun.com/gpu-mem)."""


for command in (
    check_hand_off,
    demo,
    device_plugin,
    dra_driver,
    extender,
    scheduler_config,
    seal_key,
    simulate,
    webhook,
    webhook_config,
):
    main.add_command(command)
