"""``gpushare simulate``: replay a workload under several policies and write the report.

Two accountings share the FGD paper's protocol (``gpushare.sim.experiment``): milli-GPU, where
the numbers compare with the published ones, and memory, where the extender's own scheduler core
places the pods in gpu-mem units on nodes of one mode (``--node-mode``) unless they carry their
own label. The simulator needs numpy and matplotlib, which the runtime image leaves out, so the
command checks for them first and names the extra to install.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from gpushare.cli.errors import CommandError
from gpushare.config import SchedulingConfig
from gpushare.core.model.inventory import SHARED_MODES, Mode

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from gpushare.sim.openb import TraceNode, TracePod


@click.command()
@click.option(
    "--nodes",
    "nodes_path",
    type=click.Path(),
    default=None,
    help="Nodes: openb CSV (sn,cpu_milli,memory_mib,gpu,model) or Node manifests (file or "
    "directory; chosen by content).",
)
@click.option(
    "--pods",
    "pods_path",
    type=click.Path(),
    default=None,
    help="Pods: openb CSV or Pod/Job/Deployment manifests. Without --nodes/--pods: the "
    "built-in synthetic run.",
)
@click.option(
    "--policy",
    "policies",
    multiple=True,
    help="memory accounting (the default): the extender's policies by their chart names, "
    "binpack, fgd, gpushare, spread (default: all); milli: bestfit, fgd, fgd-continuous, "
    "gpushare (default: all but fgd-continuous). Repeatable.",
)
@click.option(
    "--accounting",
    type=click.Choice(["memory", "milli"]),
    default=None,
    help="memory (default): what the chart deploys, the extender's core placing gpu-mem pods "
    "with its policy names; milli: the FGD paper's milli-GPU protocol, whose numbers compare "
    "with the published ones (and the churn protocol's only accounting).",
)
@click.option(
    "--protocol",
    type=click.Choice(["paper", "churn"]),
    default="paper",
    show_default=True,
    help="paper: every pod tried once, none leaves (the FGD paper's); churn: pods leave after "
    "their trace run time, new ones keep --load of the GPUs asked for, and pods that do not "
    "fit wait (milli accounting).",
)
@click.option(
    "--load",
    type=float,
    default=0.95,
    show_default=True,
    help="Churn: the GPU demand (running and waiting) kept present, share of capacity.",
)
@click.option(
    "--gpu-memory-unit",
    "unit_text",
    type=click.Choice(["1GiB", "128MiB"]),
    default="1GiB",
    show_default=True,
    help="The gpu-mem unit (memory mode, and reading manifests).",
)
@click.option(
    "--node-mode",
    type=click.Choice([m.value for m in SHARED_MODES]),
    default=Mode.SHARE.value,
    show_default=True,
    help="Memory mode: ack.node.gpu.schedule of nodes without their own label.",
)
@click.option(
    "--allocation-mode",
    type=click.Choice(["device-plugin", "dra"]),
    default="device-plugin",
    show_default=True,
    help="Memory accounting: device-plugin, pods bound with gpushare's allocation record; dra, "
    "every node published as its DRA driver's ResourceSlice and every GPU pod allocated as a "
    "ResourceClaim by gpushare's DRA allocator, counted as the DRA ledger reads the claim "
    "(docs/dra.md).",
)
@click.option(
    "--seeds",
    type=int,
    default=None,
    help="How many seeds (default 10 with a trace, 3 for the built-in run).",
)
@click.option("--first-seed", type=int, default=0, show_default=True)
@click.option(
    "--tune",
    type=float,
    default=1.3,
    show_default=True,
    help="Inflate the stream with clones up to this multiple of GPU capacity.",
)
@click.option(
    "--workers",
    type=int,
    default=None,
    help="Parallel processes (default: the machine's CPU count, at most 4).",
)
@click.option("--out", type=click.Path(file_okay=False), default="sim-report", show_default=True)
@click.option("--no-offline", is_flag=True, help="Skip the offline first-fit-decreasing reference.")
@click.option("--no-plots", is_flag=True)
@click.option(
    "--force",
    is_flag=True,
    help="Write into --out even when it already holds files (they are replaced).",
)
def simulate(
    nodes_path: str | None,
    pods_path: str | None,
    policies: tuple[str, ...],
    accounting: str | None,
    protocol: str,
    load: float,
    unit_text: str,
    node_mode: str,
    allocation_mode: str,
    seeds: int | None,
    first_seed: int,
    tune: float,
    workers: int | None,
    out: str,
    no_offline: bool,
    no_plots: bool,
    force: bool,
) -> None:
    """Replay a workload under several policies and report how well each packs it.

    By default it models what the chart deploys: the extender's scheduler core, counting
    aliyun.com/gpu-mem in the chart's unit, with the extender's policy names (the chart runs
    gpushare). --accounting milli replays the FGD paper's milli-GPU protocol instead. The first
    line printed says which model runs.

    The report folder (--out) gets table.md, report.json, curve.png and, in milli accounting,
    fragmentation.png; with --protocol churn it gets churn.md, churn.json and churn.png
    instead. A folder that already holds files is refused unless --force is given.
    """
    import importlib.util
    import os
    from pathlib import Path

    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    missing = [m for m in ("numpy", "matplotlib") if importlib.util.find_spec(m) is None]
    if missing:
        raise click.ClickException(
            f"the simulator needs {' and '.join(missing)}, which the runtime install leaves "
            "out: install the extra, pip install 'gpushare[sim]' (or -e '.[sim]' in a checkout)"
        )

    from gpushare.core.model.units import MemoryUnit
    from gpushare.sim import gpumem, report, synthetic
    from gpushare.sim.experiment import Experiment, SeedResult, run_experiment
    from gpushare.sim.kubeyaml import read_workload
    from gpushare.sim.milligpu import POLICIES
    from gpushare.sim.openb import TraceError
    from gpushare.sim.progress import PlainProgress

    console = Console()
    if not console.is_terminal:
        console.width = 160  # a log or a pipe: keep the table's rows on one line each
    unit = MemoryUnit.parse(unit_text)
    if accounting is None:  # the churn protocol has only the paper's accounting
        accounting = "milli" if protocol == "churn" else "memory"
    if allocation_mode == "dra" and accounting != "memory":
        raise click.UsageError(
            "--allocation-mode dra runs in memory accounting (DRA claims hold GPU memory); "
            "leave out --accounting milli and --protocol churn"
        )
    settings = (
        gpumem.MemorySettings(unit, Mode(node_mode), allocation_mode=allocation_mode)
        if accounting == "memory"
        else None
    )
    known = gpumem.policies() if settings else list(POLICIES)
    chosen = list(policies) or (known if settings else ["bestfit", "fgd", "gpushare"])
    for name in chosen:
        if name not in known:
            raise click.BadParameter(
                f"{name!r} is not a policy in {accounting} accounting; choose from "
                f"{', '.join(known)}",
                param_hint="--policy",
            )
    if (nodes_path is None) != (pods_path is None):
        raise click.UsageError("give both --nodes and --pods, or neither for the built-in run")
    if not 1.0 <= tune <= 3.0:
        raise click.BadParameter(f"{tune} must be between 1.0 and 3.0", param_hint="--tune")
    if protocol == "churn" and settings is not None:
        raise click.UsageError(
            "--protocol churn runs in milli accounting; leave out --accounting memory"
        )
    if not 0.5 <= load <= 1.0:
        raise click.BadParameter(f"{load} must be between 0.5 and 1.0", param_hint="--load")
    try:
        if nodes_path and pods_path:
            nodes, pods = read_workload(Path(nodes_path), Path(pods_path), unit=unit)
            stem = Path(pods_path).stem
            trace = stem.removeprefix("openb_pod_list_")
        else:
            nodes = synthetic.nodes()
            pods = synthetic.pods(nodes)
            trace = "synthetic"
        if settings:
            gpumem.check(nodes, unit)
            mode_note = ", DRA mode" if allocation_mode == "dra" else ""
            trace += f" (memory, {unit.value}, {node_mode}{mode_note})"
    except TraceError as err:
        raise CommandError(str(err)) from None
    if not nodes or not pods:
        raise CommandError("the node list and the pod list must not be empty")
    count = seeds if seeds is not None else (10 if nodes_path else 3)
    if count < 1:
        raise click.BadParameter(f"{count} must be at least 1", param_hint="--seeds")
    folder = Path(out)
    if folder.is_dir() and any(folder.iterdir()) and not force:
        raise CommandError(
            f"the report folder {folder} already holds files (an earlier report?); "
            f"pass --force to overwrite them, or --out NEW_FOLDER to keep them"
        )
    seed_list = list(range(first_seed, first_seed + count))
    click.echo(model_line(accounting, protocol, unit_text, node_mode, allocation_mode))
    if protocol == "churn":
        _churn(trace, nodes, pods, chosen, seed_list, load, workers, folder, no_plots)
        return
    jobs = (len(chosen) + (0 if no_offline or settings else 1)) * count
    workers = workers or min(4, os.cpu_count() or 1)
    console.print(
        f"{trace}: {len(nodes)} nodes, {sum(n.gpus for n in nodes)} GPUs, {len(pods)} pods; "
        f"policies {', '.join(chosen)}; seeds {seed_list[0]}..{seed_list[-1]}; "
        f"{workers} worker(s)"
    )

    def replay(progress: Callable[[SeedResult], None]) -> Experiment:
        return run_experiment(
            trace,
            nodes,
            pods,
            chosen,
            seed_list,
            tune=tune,
            workers=workers,
            offline=not no_offline,
            progress=progress,
            memory=settings,
        )

    if console.is_terminal:
        with Progress(console=console, transient=True) as bar:
            task = bar.add_task("replaying", total=jobs)
            experiment = replay(lambda r: bar.advance(task))
    else:  # a pipe or a log: a bar drawn with cursor moves shows nothing there
        experiment = replay(PlainProgress(jobs, say=lambda line: click.echo(line, err=True)))
    rows = report.table(experiment)
    grid = Table(
        title="unallocated GPU % at arrived %, lower is better",
        caption=f"{trace}; {report.describe(count)}",
    )
    for header in rows[0]:
        grid.add_column(header)
    for row in rows[1:]:
        grid.add_row(*row)
    console.print(grid)
    for policy, reasons in report.failures(experiment).items():
        text = ", ".join(f"{reason} {n:.0f}" for reason, n in reasons.items())
        console.print(f"failed pods per seed, {policy}: {text}")
    if not experiment.bound and settings is None:
        console.print(
            "no LP lower bound: it needs scipy (pip install -e '.[bench]'); "
            "offline-ffd is no bound",
            markup=False,
        )
    files = report.write(experiment, folder, plots=not no_plots)
    console.print("wrote " + ", ".join(str(f) for f in files))


def _churn(
    trace: str,
    nodes: list[TraceNode],
    pods: list[TracePod],
    policies: list[str],
    seeds: list[int],
    load: float,
    workers: int | None,
    folder: Path,
    no_plots: bool,
) -> None:
    """The churn protocol (``sim.churn``): the table per reference policy, then the files."""
    import os

    from gpushare.sim import churnreport
    from gpushare.sim.progress import PlainProgress

    workers = workers or min(4, os.cpu_count() or 1)
    click.echo(
        f"{trace}: {len(nodes)} nodes, {sum(n.gpus for n in nodes)} GPUs; churn at "
        f"{100 * load:.0f} % of capacity; policies {', '.join(policies)}; seeds "
        f"{seeds[0]}..{seeds[-1]}; {workers} worker(s)"
    )
    say = PlainProgress(len(policies) * len(seeds), say=lambda line: click.echo(line, err=True))
    experiment = churnreport.run_churn_experiment(
        trace, nodes, pods, policies, seeds, load=load, workers=workers, progress=say
    )
    lines: list[str] = []
    for reference in ("fgd", "bestfit"):
        if reference in policies and len(policies) > 1:
            lines += [*churnreport.header(reference), *churnreport.rows(experiment, reference), ""]
    if not lines:
        lines = [*churnreport.header(policies[0]), *churnreport.rows(experiment, policies[0])]
    text = "\n".join(lines).rstrip() + "\n"
    click.echo(text)
    files = churnreport.write(experiment, folder, plot=not no_plots)
    table = folder / "churn.md"
    table.write_text(text)
    click.echo("wrote " + ", ".join(str(f) for f in [table, *files]))


CHART_POLICY: str = SchedulingConfig.model_fields["policy"].default
"""The extender's policy when none is set, which is the chart's ``policy`` value too."""


def model_line(
    accounting: str,
    protocol: str,
    unit: str,
    node_mode: str,
    allocation_mode: str = "device-plugin",
) -> str:
    """The one line that says which model the run is, and how to get the other one.

    A platform engineer reads the default as a prediction of their cluster, so the line says
    when the numbers are the paper's protocol instead, which the chart does not run.
    """
    if accounting == "memory" and allocation_mode == "dra":
        return (
            f"model: what the chart deploys in DRA mode: nodes as their DRA driver's "
            f"ResourceSlices, each GPU pod's gpu-mem in {unit} units as a ResourceClaim "
            f"allocated by the extender's DRA allocator (its scheduler core), nodes without a "
            f"label in {node_mode} mode, the extender's policy names (the chart runs "
            f"{CHART_POLICY}); for device-plugin mode leave out --allocation-mode dra"
        )
    if accounting == "memory":
        return (
            f"model: what the chart deploys: the extender's scheduler core, aliyun.com/gpu-mem "
            f"in {unit} units, nodes without a label in {node_mode} mode, the extender's "
            f"policy names (the chart runs {CHART_POLICY}); for the FGD paper's milli-GPU "
            f"protocol, pass --accounting milli"
        )
    if protocol == "churn":
        return (
            "model: the churn protocol in the FGD paper's milli-GPU accounting (its only one), "
            "with the paper's policy names; not the extender's gpu-mem accounting"
        )
    return (
        "model: the FGD paper's milli-GPU protocol (--accounting milli), with the paper's "
        "policy names; numbers compare with the published ones, not with the chart's "
        "deployment (leave out --accounting milli to model that)"
    )
