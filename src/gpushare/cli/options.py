"""The scheduling flags several commands share, and the one path from them to settings.

The extender, the webhook and the device plugin each take the memory unit, the pods per GPU and
the resource names; whatever flags and environment a command reads them from, it hands them to
:func:`scheduling_config`, which validates them with ``gpushare.config.load``, so every component
refuses the same values with the same message, and the chart, which passes them all the same
values, never starts one that reads them differently.

The two node drivers, ``gpushare device-plugin`` and ``gpushare dra-driver``, also share the
flags that describe the node (:func:`node_driver_options`: its GPUs, directories, isolation and
hand-off), validated by ``cli.pluginoptions.isolation_flags``, so both read a node the same way.
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


def node_driver_options(*, state_dir_help: str, strategy_help: str, health_help: str) -> Decorator:
    """The flags both node drivers take, with the help texts that differ between them.

    The state directory, the device-list strategy and the health port mean the same setting to
    both commands but hold or hand over different things (a device plugin's Allocate, a DRA
    claim's CDI spec), so each command words their help itself.
    """
    return option_group(
        click.option(
            "--node-name", envvar="NODE_NAME", required=True, help="This node (env NODE_NAME)."
        ),
        click.option(
            "--fake-gpus",
            default=None,
            help="Fake GPUs instead of NVML: 4x15GiB or T4:15GiB,A10:24GiB.",
        ),
        click.option(
            "--fake-health-file",
            default=None,
            help="With --fake-gpus: a file listing the indexes of failed GPUs (tests withdraw "
            "GPUs).",
        ),
        click.option(
            "--state-dir", default="/var/lib/gpushare", show_default=True, help=state_dir_help
        ),
        click.option(
            "--isolation",
            type=click.Choice(["auto", "none"]),
            default="auto",
            show_default=True,
            help="auto: enforce cgpu/core_mem (interposer) and mps limits, refusing to start when "
            "it cannot; none: serve every mode without isolation.",
        ),
        click.option(
            "--isolation-lib-dir",
            default="/usr/local/gpushare",
            show_default=True,
            help="Host directory the interposer library is copied into and mounted from.",
        ),
        click.option(
            "--cgpu-policy",
            default="5",
            envvar="GPUSHARE_ISOLATION_POLICY",
            show_default=True,
            help="cgpu nodes: ACK's cGPU computing-power policy, 0 even share, 1 preemptive, "
            "2 weighted preemptive, 3 fixed share, 4 soft, 5 native (no limit).",
        ),
        click.option(
            "--max-pods-per-gpu",
            default=None,
            envvar="GPUSHARE_MAX_PODS_PER_GPU",
            help="The chart's maxPodsPerGpu (1..64; default 20, or 16 at 128MiB): cGPU policy 0 "
            "gives each container one over it, and it bounds ALIYUN_COM_GPU_SCHD_WEIGHT.",
        ),
        click.option(
            "--device-list-strategy",
            default="cdi-cri",
            envvar="GPUSHARE_DEVICE_LIST_STRATEGY",
            show_default=True,
            help=strategy_help,
        ),
        click.option(
            "--driver-root",
            default="",
            help="The host's NVIDIA driver directory (GKE: /home/kubernetes/bin/nvidia), mounted "
            "at the same path in the plugin: NVML is loaded from its lib64/, lib/ or "
            "lib/x86_64-linux-gnu/, and under driver-root containers get it read-only. Empty: "
            "NVML from the loader's path.",
        ),
        click.option(
            "--driver-root-container-path",
            default="/usr/local/nvidia",
            show_default=True,
            help="driver-root: where containers see --driver-root (GKE's convention).",
        ),
        click.option(
            "--dev-root",
            default="/dev",
            show_default=True,
            help="driver-root: the host's device directory, mounted at the same path in the "
            "plugin; containers get its nvidia<minor>, nvidiactl, nvidia-uvm and "
            "nvidia-uvm-tools at /dev.",
        ),
        click.option(
            "--cdi-kind",
            default="nvidia.com/gpu",
            show_default=True,
            help="cdi-cri: the CDI kind of the GPUs, as the NVIDIA Container Toolkit's spec "
            "declares it.",
        ),
        click.option(
            "--cdi-spec-dirs",
            default="/etc/cdi,/var/run/cdi",
            show_default=True,
            help="cdi-cri: where the node's CDI specs are (the container runtime's "
            "cdi_spec_dirs), comma-separated.",
        ),
        click.option("--kubeconfig", default=None),
        click.option(
            "--health-port",
            type=click.IntRange(min=0, max=65535),
            default=0,
            show_default=True,
            help=health_help,
        ),
    )


def scheduling_config(**flags: object) -> SchedulingConfig:
    """The settings the flags give (None: the default); a CommandError says what is wrong."""
    try:
        return load(**flags)
    except ConfigError as err:
        raise CommandError(str(err)) from None
