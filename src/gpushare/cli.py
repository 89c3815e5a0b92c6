"""``gpushare``: the command-line entry point for every component."""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import TYPE_CHECKING, Any

import click

from gpushare import __version__
from gpushare.config import ConfigError, load
from gpushare.core.inventory import SHARED_MODES, Mode
from gpushare.core.names import DEFAULT_SCHEDULER, SCHEDULER_NAME

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpushare.core.trust import Trust


@click.group()
@click.version_option(__version__, prog_name="gpushare")
def main() -> None:
    """Shared GPU scheduling for Kubernetes (aliyun.com/gpu-mem)."""


@main.command()
def demo() -> None:
    """Run the seed walkthrough in one process, on an in-memory cluster."""
    from gpushare.demo import run_demo

    run_demo()


def _scheduling_options(func: click.decorators.FC) -> click.decorators.FC:
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


def _seal_options(func: click.decorators.FC) -> click.decorators.FC:
    func = click.option(
        "--insecure-no-seal",
        is_flag=True,
        help="Run without a seal key: allocations are checked for structure only, so a tenant "
        "who creates a pod with spec.nodeName and a matching gpushare.io/allocation is counted "
        "and served. For tests only.",
    )(func)
    func = click.option(
        "--seal-key-file",
        default=None,
        help="The key that seals allocations (gpushare.io/seal); the same file for the extender "
        "and every device plugin. Make one with `gpushare seal-key > seal.key`.",
    )(func)
    return func


def _trust(seal_key_file: str | None, insecure_no_seal: bool) -> Trust:
    """The ``Trust`` the flags ask for; exits with a message saying how to make a key."""
    from pathlib import Path

    from gpushare.core.trust import Trust
    from gpushare.kube.sealing import HOW_TO_MAKE, SealKeyError, load_key_file

    if seal_key_file and insecure_no_seal:
        click.echo("error: give --seal-key-file or --insecure-no-seal, not both", err=True)
        sys.exit(2)
    if insecure_no_seal:
        click.echo(
            "warning: --insecure-no-seal: allocations are not sealed or checked for a seal; "
            "any tenant who can create a pod with spec.nodeName and a gpushare.io/allocation "
            "matching its own request is counted and served",
            err=True,
        )
        return Trust.structural()
    if not seal_key_file:
        click.echo(f"error: no --seal-key-file given: {HOW_TO_MAKE}", err=True)
        sys.exit(2)
    try:
        return Trust.sealed(load_key_file(Path(seal_key_file)))
    except SealKeyError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(2)


@main.command("seal-key")
def seal_key() -> None:
    """Print a new random seal key (for --seal-key-file, or the Secret gpushare-seal)."""
    from gpushare.kube.sealing import new_key_text

    click.echo(new_key_text())


def _resource_name_options(func: click.decorators.FC) -> click.decorators.FC:
    func = click.option("--count-resource", default=None, help="Default aliyun.com/gpu-count.")(
        func
    )
    func = click.option(
        "--core-resource", default=None, help="Default aliyun.com/gpu-core.percentage."
    )(func)
    func = click.option("--mem-resource", default=None, help="Default aliyun.com/gpu-mem.")(func)
    return func


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=32766, show_default=True, type=int)
@click.option(
    "--kubeconfig", default=None, help="Path to a kubeconfig (default: in-cluster or $KUBECONFIG)."
)
@click.option("--context", default=None)
@click.option("--log-level", default="info", show_default=True)
@click.option(
    "--metrics-port",
    type=int,
    default=0,
    show_default=True,
    help="Also serve /metrics alone on 0.0.0.0:PORT (0: only on --port), for Prometheus when "
    "--host is 127.0.0.1.",
)
@_scheduling_options
@_resource_name_options
@_seal_options
def extender(
    host: str,
    port: int,
    metrics_port: int,
    kubeconfig: str | None,
    context: str | None,
    log_level: str,
    gpu_memory_unit: str | None,
    policy: str | None,
    max_pods_per_gpu: int | None,
    mem_resource: str | None,
    core_resource: str | None,
    count_resource: str | None,
    seal_key_file: str | None,
    insecure_no_seal: bool,
) -> None:
    """Serve the kube-scheduler extender (filter, prioritize, bind) over HTTP."""
    import asyncio

    import uvicorn

    from gpushare.core.scheduling import Scheduler
    from gpushare.extender.app import create_app, create_metrics_app, server_config
    from gpushare.extender.service import Extender
    from gpushare.kube.cache import ClusterCache
    from gpushare.kube.lightkube_api import LightkubeAPI
    from gpushare.kube.port import KubeError

    try:
        config = load(
            gpu_memory_unit=gpu_memory_unit,
            policy=policy,
            max_pods_per_gpu=max_pods_per_gpu,
            mem_resource=mem_resource,
            core_resource=core_resource,
            count_resource=count_resource,
        )
    except ConfigError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(2)
    trust = _trust(seal_key_file, insecure_no_seal)
    try:
        api = LightkubeAPI.connect(kubeconfig, context)
    except KubeError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(2)
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    settings = config.settings()
    scheduler = Scheduler(settings)
    from gpushare.core.policybook import PolicyBook
    from gpushare.kube.policies import PolicyWatch

    book = PolicyBook()
    cache = ClusterCache(
        api, settings=settings, workload=scheduler.workload, trust=trust, book=book
    )
    service = Extender(api=api, cache=cache, scheduler=scheduler)
    policies = PolicyWatch(api, book, notify=service.policy_notice)
    app = create_app(service, run_cache=True, policies=policies)
    main_server = uvicorn.Server(server_config(app, host=host, port=port, log_level=log_level))
    if not metrics_port:
        main_server.run()
        return
    metrics_config = server_config(
        create_metrics_app(service), host="0.0.0.0", port=metrics_port, log_level=log_level
    )

    async def both() -> None:
        metrics_server = uvicorn.Server(metrics_config)
        await asyncio.gather(main_server.serve(), metrics_server.serve())

    with asyncio.Runner(loop_factory=main_server.config.get_loop_factory()) as runner:
        runner.run(both())


@main.command("device-plugin")
@click.option("--node-name", envvar="NODE_NAME", required=True, help="This node (env NODE_NAME).")
@click.option(
    "--fake-gpus", default=None, help="Fake GPUs instead of NVML: 4x15GiB or T4:15GiB,A10:24GiB."
)
@click.option(
    "--fake-health-file",
    default=None,
    help="With --fake-gpus: a file listing the indexes of failed GPUs (tests withdraw GPUs).",
)
@click.option(
    "--fake-topology",
    default="",
    help="With --fake-gpus: how they are connected, published as gpushare.io/gpu-topology: "
    "nvswitch, nvlink-pairs, nvlink-islands, pcie, or a distance matrix such as 0,1;1,0 "
    "(docs/topology.md). Empty: none.",
)
@click.option("--gpu-memory-unit", default="1GiB", show_default=True)
@click.option("--device-plugin-dir", default="/var/lib/kubelet/device-plugins", show_default=True)
@click.option(
    "--pod-resources-socket",
    default="/var/lib/kubelet/pod-resources/kubelet.sock",
    show_default=True,
)
@click.option(
    "--state-dir",
    default="/var/lib/gpushare",
    show_default=True,
    help=(
        "Checkpoint, limits files, accounting broker sockets and MPS pipes; the same path as "
        "on the host."
    ),
)
@click.option(
    "--isolation",
    type=click.Choice(["auto", "none"]),
    default="auto",
    show_default=True,
    help="auto: enforce cgpu/core_mem (interposer) and mps limits, refusing to start when it "
    "cannot; none: serve every mode without isolation.",
)
@click.option(
    "--isolation-lib-dir",
    default="/usr/local/gpushare",
    show_default=True,
    help="Host directory the interposer library is copied into and mounted from.",
)
@click.option(
    "--cgpu-policy",
    default="5",
    envvar="GPUSHARE_ISOLATION_POLICY",
    show_default=True,
    help="cgpu nodes: ACK's cGPU computing-power policy, 0 even share, 1 preemptive, "
    "2 weighted preemptive, 3 fixed share, 4 soft, 5 native (no limit).",
)
@click.option(
    "--max-pods-per-gpu",
    default=None,
    envvar="GPUSHARE_MAX_PODS_PER_GPU",
    help="The chart's maxPodsPerGpu (1..64; default 20, or 16 at 128MiB): cGPU policy 0 gives "
    "each container one over it, and it bounds ALIYUN_COM_GPU_SCHD_WEIGHT.",
)
@click.option("--kubelet-config", default="/var/lib/kubelet/config.yaml", show_default=True)
@click.option(
    "--cpu-manager-state", default="/var/lib/kubelet/cpu_manager_state", show_default=True
)
@click.option("--kubeconfig", default=None)
@click.option("--log-level", default="info", show_default=True)
@click.option(
    "--metrics-port",
    type=int,
    default=9400,
    show_default=True,
    help="Serve Prometheus /metrics on this port (0 disables).",
)
@_resource_name_options
@_seal_options
def device_plugin(
    node_name: str,
    fake_gpus: str | None,
    fake_health_file: str | None,
    fake_topology: str,
    gpu_memory_unit: str,
    device_plugin_dir: str,
    pod_resources_socket: str,
    state_dir: str,
    isolation: str,
    isolation_lib_dir: str,
    cgpu_policy: str,
    max_pods_per_gpu: str | None,
    kubelet_config: str,
    cpu_manager_state: str,
    kubeconfig: str | None,
    log_level: str,
    metrics_port: int,
    mem_resource: str | None,
    core_resource: str | None,
    count_resource: str | None,
    seal_key_file: str | None,
    insecure_no_seal: bool,
) -> None:
    """Serve kubelet's device plugin API for this node's shared GPUs."""
    from gpushare.isolation.policy import PolicyError, parse_max_pods, parse_policy

    try:
        policy_number = parse_policy(cgpu_policy, "--cgpu-policy (GPUSHARE_ISOLATION_POLICY)")
    except PolicyError as err:
        raise click.BadParameter(str(err), param_hint="--cgpu-policy") from None
    try:
        max_pods = None if max_pods_per_gpu is None else parse_max_pods(max_pods_per_gpu)
    except PolicyError as err:
        raise click.BadParameter(str(err), param_hint="--max-pods-per-gpu") from None
    import asyncio
    from pathlib import Path

    from gpushare.core.names import ResourceNames
    from gpushare.core.units import MemoryUnit
    from gpushare.deviceplugin.config import PluginConfig
    from gpushare.deviceplugin.gpus import FakeGpus, GpuSource, NvmlGpus
    from gpushare.deviceplugin.isolation import NodeIsolation, packaged_library
    from gpushare.deviceplugin.metrics import registry_for, serve_metrics
    from gpushare.deviceplugin.plugin import DevicePlugin
    from gpushare.deviceplugin.preflight import StartRefused, refuse_static_cpu_policy
    from gpushare.kube.lightkube_api import LightkubeAPI
    from gpushare.kube.port import KubeError

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    trust = _trust(seal_key_file, insecure_no_seal)
    reason = refuse_static_cpu_policy(Path(kubelet_config), Path(cpu_manager_state))
    if reason:
        click.echo(f"error: {reason}", err=True)
        sys.exit(2)
    if fake_topology and not fake_gpus:
        click.echo("error: --fake-topology describes fake GPUs; give --fake-gpus too", err=True)
        sys.exit(2)
    try:
        unit = MemoryUnit.parse(gpu_memory_unit)
        health = Path(fake_health_file) if fake_health_file else None
        source: GpuSource = (
            FakeGpus.parse(fake_gpus, node=node_name, health_file=health, topology=fake_topology)
            if fake_gpus
            else NvmlGpus()
        )
        api = LightkubeAPI.connect(kubeconfig)
    except ValueError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(2)
    except KubeError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(2)
    except Exception as err:
        click.echo(
            f"error: cannot read GPUs through NVML ({type(err).__name__}: {err}); "
            f"is the NVIDIA driver installed, and does this container see /dev/nvidiactl, "
            f"/dev/nvidia<N> and libnvidia-ml.so.1? The chart gets them from the NVIDIA "
            f"container runtime (NVIDIA_VISIBLE_DEVICES=all; set devicePlugin.runtimeClassName "
            f"where it is not the node's default runtime). For tests use --fake-gpus",
            err=True,
        )
        sys.exit(2)
    gpus = source.gpus()
    click.echo(
        f"gpushare device plugin on {node_name}: {len(gpus)} GPU(s) "
        + ", ".join(f"{g.index}:{g.model}:{g.memory_mib}MiB" for g in gpus),
        err=True,
    )
    config = PluginConfig(
        node=node_name,
        plugin_dir=Path(device_plugin_dir),
        pod_resources_socket=Path(pod_resources_socket),
        state_dir=Path(state_dir),
        unit=unit,
        max_pods_per_gpu=max_pods,
        names=ResourceNames(
            **{
                key: value
                for key, value in (
                    ("mem", mem_resource),
                    ("core", core_resource),
                    ("count", count_resource),
                )
                if value
            }
        ),
    )

    hook = NodeIsolation(
        cgpu_policy=policy_number,
        max_pods=max_pods,
        policy=isolation,
        lib_dir=Path(isolation_lib_dir),
        state_dir=Path(state_dir),
        unit=unit,
        source=source,
        packaged=packaged_library(),
    )
    plugin = DevicePlugin(api=api, source=source, config=config, hook=hook, trust=trust)
    try:
        serve_metrics(registry_for(plugin, node_name), port=metrics_port)
    except OSError as err:
        click.echo(f"error: cannot serve metrics on port {metrics_port}: {err}", err=True)
        sys.exit(2)

    async def serve() -> None:
        await plugin.start()
        try:
            await asyncio.Event().wait()
        finally:
            await plugin.stop()

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve())
    except StartRefused as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(2)


@main.command()
@click.option("--host", default="0.0.0.0", show_default=True)
@click.option("--port", default=9443, show_default=True, type=int)
@click.option("--tls-cert-file", required=True, help="PEM serving certificate (with chain).")
@click.option("--tls-private-key-file", required=True, help="PEM private key of the certificate.")
@click.option("--gpu-memory-unit", default=None, help="1GiB (default) or 128MiB.")
@click.option(
    "--max-pods-per-gpu",
    type=int,
    default=None,
    help="Accepted so the chart can pass one argument list; no pod-level rule uses it.",
)
@click.option("--mem-resource", default=None, help="Default aliyun.com/gpu-mem.")
@click.option("--core-resource", default=None, help="Default aliyun.com/gpu-core.percentage.")
@click.option("--count-resource", default=None, help="Default aliyun.com/gpu-count.")
@click.option(
    "--trusted-user",
    multiple=True,
    help="Username whose writes of gpushare.io/* and ALIYUN_COM_GPU_MEM_* pod annotations (and "
    "nodeName on GPU pods) pass: the extender's and the device plugin's ServiceAccounts, "
    "system:serviceaccount:NAMESPACE:NAME (repeatable).",
)
@click.option("--trusted-group", multiple=True, help="Group trusted the same way (repeatable).")
@click.option(
    "--scheduler-name",
    default=SCHEDULER_NAME,
    show_default=True,
    help="The scheduler profile that runs gpushare's extender.",
)
@click.option(
    "--steer-from",
    multiple=True,
    default=[DEFAULT_SCHEDULER],
    show_default=True,
    help="A scheduler name that counts as none named: POST /mutate gives GPU pods naming it "
    "--scheduler-name instead (repeatable). The API server writes default-scheduler into an "
    "empty schedulerName before admission.",
)
@click.option(
    "--no-steer",
    is_flag=True,
    help="POST /mutate changes nothing (the chart's webhook.steer.enabled=false).",
)
@click.option("--log-level", default="info", show_default=True)
def webhook(
    host: str,
    port: int,
    tls_cert_file: str,
    tls_private_key_file: str,
    gpu_memory_unit: str | None,
    max_pods_per_gpu: int | None,
    mem_resource: str | None,
    core_resource: str | None,
    count_resource: str | None,
    trusted_user: tuple[str, ...],
    trusted_group: tuple[str, ...],
    scheduler_name: str,
    steer_from: tuple[str, ...],
    no_steer: bool,
    log_level: str,
) -> None:
    """Serve the admission webhook (POST /validate, POST /mutate) over HTTPS."""
    from pathlib import Path

    import uvicorn

    from gpushare.core.admission import AdmissionSettings
    from gpushare.core.tampering import Trust
    from gpushare.webhook.app import create_app, server_config

    try:
        scheduling = load(
            gpu_memory_unit=gpu_memory_unit,
            max_pods_per_gpu=max_pods_per_gpu,
            mem_resource=mem_resource,
            core_resource=core_resource,
            count_resource=count_resource,
        ).settings()
    except ConfigError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(2)
    settings = AdmissionSettings(
        names=scheduling.names,
        unit=scheduling.unit,
        trust=Trust(users=frozenset(trusted_user), groups=frozenset(trusted_group)),
        scheduler_name=scheduler_name,
        steer_from=() if no_steer else tuple(steer_from),
    )
    for flag, path in (
        ("--tls-cert-file", tls_cert_file),
        ("--tls-private-key-file", tls_private_key_file),
    ):
        if not Path(path).is_file():
            click.echo(f"error: {flag}={path!r} is not a readable file", err=True)
            sys.exit(2)
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    app = create_app(settings)
    config = server_config(
        app,
        host=host,
        port=port,
        cert_file=tls_cert_file,
        key_file=tls_private_key_file,
        log_level=log_level,
    )
    uvicorn.Server(config).run()


@main.command("webhook-config")
@click.option("--url", default=None, help="https://HOST:PORT/validate, for a webhook outside.")
@click.option(
    "--service",
    default=None,
    help="NAMESPACE/NAME[:PORT] of the webhook's Service (port default 443).",
)
@click.option("--ca-bundle-file", required=True, help="PEM CA that signed the serving cert.")
@click.option(
    "--failure-policy",
    type=click.Choice(["Fail", "Ignore"]),
    default="Fail",
    show_default=True,
    help="Fail: nothing the webhook refuses is admitted while it is down (Ignore lets every "
    "forged annotation, nodeName and isolation variable through then).",
)
@click.option("--timeout-seconds", type=int, default=5, show_default=True)
@click.option(
    "--exclude-namespace",
    multiple=True,
    help="Namespace never checked (repeatable; default kube-system).",
)
@click.option(
    "--namespace-label", multiple=True, help="KEY=VALUE a namespace must carry (repeatable)."
)
@click.option(
    "--trusted-user",
    multiple=True,
    help="Username left out by a matchCondition (the webhook's own --trusted-user; repeatable).",
)
@click.option("--trusted-group", multiple=True, help="Group left out the same way (repeatable).")
@click.option(
    "--with-policy",
    is_flag=True,
    help="Also print the ValidatingAdmissionPolicy and its binding that keep the annotation "
    "and nodeName rules while the webhook is down.",
)
@click.option(
    "--no-steer",
    is_flag=True,
    help="Leave out the MutatingWebhookConfiguration that gives GPU pods naming no scheduler "
    "schedulerName ack-co-scheduler (then run gpushare webhook --no-steer too).",
)
@click.option(
    "--steer-from",
    multiple=True,
    default=[DEFAULT_SCHEDULER],
    show_default=True,
    help="Scheduler name that counts as none named (the webhook's own --steer-from; repeatable).",
)
@click.option(
    "--steer-url",
    default=None,
    help="https://HOST:PORT/mutate; default: --url with /validate replaced by /mutate.",
)
@click.option("--mem-resource", default="aliyun.com/gpu-mem", show_default=True)
@click.option("--core-resource", default="aliyun.com/gpu-core.percentage", show_default=True)
def webhook_config(
    url: str | None,
    service: str | None,
    ca_bundle_file: str,
    failure_policy: str,
    timeout_seconds: int,
    exclude_namespace: tuple[str, ...],
    namespace_label: tuple[str, ...],
    trusted_user: tuple[str, ...],
    trusted_group: tuple[str, ...],
    with_policy: bool,
    no_steer: bool,
    steer_from: tuple[str, ...],
    steer_url: str | None,
    mem_resource: str,
    core_resource: str,
) -> None:
    """Print the webhook configurations that send reviews to gpushare webhook.

    The ValidatingWebhookConfiguration, then (unless --no-steer) the
    MutatingWebhookConfiguration for GPU pods that name no scheduler.
    """
    import base64
    from pathlib import Path

    import yaml

    from gpushare.core.names import ResourceNames
    from gpushare.webhook.configuration import (
        DEFAULT_EXCLUDED_NAMESPACES,
        PATH,
        STEERING_PATH,
        steering_configuration,
        webhook_configuration,
    )
    from gpushare.webhook.policy import handoff_policy

    labels = {}
    for item in namespace_label:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r}: write KEY=VALUE", param_hint="--namespace-label")
        labels[key] = value
    target: dict[str, object] | None = None
    if service:
        namespace, _, rest = service.partition("/")
        name, _, port = rest.partition(":")
        if not namespace or not name or (port and not port.isdigit()):
            raise click.BadParameter(
                f"{service!r}: write NAMESPACE/NAME or NAMESPACE/NAME:PORT", param_hint="--service"
            )
        target = {"namespace": namespace, "name": name, "port": int(port or 443)}
    excluded = exclude_namespace or DEFAULT_EXCLUDED_NAMESPACES
    common: dict[str, Any] = {
        "ca_bundle": base64.b64encode(Path(ca_bundle_file).read_bytes()).decode(),
        "service": target,
        "failure_policy": "Fail" if failure_policy == "Fail" else "Ignore",
        "timeout_seconds": timeout_seconds,
        "excluded_namespaces": excluded,
        "namespace_labels": labels,
    }
    names = ResourceNames(mem=mem_resource, core=core_resource)
    if not no_steer and url is not None and steer_url is None:
        if not url.endswith(PATH):
            raise click.BadParameter(
                f"{url!r} does not end in {PATH}, so the steering webhook's URL cannot be "
                f"derived from it; give --steer-url https://HOST:PORT{STEERING_PATH} or "
                f"--no-steer",
                param_hint="--url",
            )
        steer_url = url.removesuffix(PATH) + STEERING_PATH
    try:
        documents = [
            webhook_configuration(
                url=url, trusted_users=trusted_user, trusted_groups=trusted_group, **common
            )
        ]
        if not no_steer:
            documents.append(
                steering_configuration(
                    url=steer_url if url is not None else None,
                    steer_from=steer_from,
                    names=names,
                    **common,
                )
            )
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    if with_policy:
        documents += handoff_policy(
            names=names,
            trusted_users=trusted_user,
            trusted_groups=trusted_group,
            excluded_namespaces=excluded,
            namespace_labels=labels,
        )
    click.echo(yaml.safe_dump_all(documents, sort_keys=False), nl=False)


@main.command("scheduler-config")
@click.option(
    "--url",
    default="http://127.0.0.1:32766",
    show_default=True,
    help="The extender's URL as kube-scheduler reaches it.",
)
@click.option(
    "--kubeconfig",
    default="/etc/kubernetes/scheduler.conf",
    show_default=True,
    help="kube-scheduler's own kubeconfig path ('' to leave out).",
)
@click.option("--no-leader-elect", is_flag=True)
def scheduler_config(url: str, kubeconfig: str, no_leader_elect: bool) -> None:
    """Print the KubeSchedulerConfiguration wiring kube-scheduler to the extender."""
    from gpushare.schedconfig import render_yaml, scheduler_configuration

    click.echo(
        render_yaml(
            scheduler_configuration(
                url=url, kubeconfig=kubeconfig or None, leader_elect=not no_leader_elect
            )
        ),
        nl=False,
    )


@main.command()
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
    help="milli: bestfit, fgd, fgd-continuous, gpushare (default: all but fgd-continuous); "
    "memory: the core's node policies (default: all). Repeatable.",
)
@click.option(
    "--accounting",
    type=click.Choice(["milli", "memory"]),
    default="milli",
    show_default=True,
    help="milli: the paper's milli-GPU; memory: the extender's core places gpu-mem pods.",
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
    accounting: str,
    unit_text: str,
    node_mode: str,
    seeds: int | None,
    first_seed: int,
    tune: float,
    workers: int | None,
    out: str,
    no_offline: bool,
    no_plots: bool,
    force: bool,
) -> None:
    """Replay a workload under several policies with the FGD paper's protocol and report.

    The report folder (--out) gets table.md, report.json, curve.png and fragmentation.png; a
    folder that already holds files is refused unless --force is given.
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

    from gpushare.core.units import MemoryUnit
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
    settings = gpumem.MemorySettings(unit, Mode(node_mode)) if accounting == "memory" else None
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
            trace += f" (memory, {unit.value}, {node_mode})"
    except TraceError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(2)
    if not nodes or not pods:
        click.echo("error: the node list and the pod list must not be empty", err=True)
        sys.exit(2)
    count = seeds if seeds is not None else (10 if nodes_path else 3)
    if count < 1:
        raise click.BadParameter(f"{count} must be at least 1", param_hint="--seeds")
    folder = Path(out)
    if folder.is_dir() and any(folder.iterdir()) and not force:
        click.echo(
            f"error: the report folder {folder} already holds files (an earlier report?); "
            f"pass --force to overwrite them, or --out NEW_FOLDER to keep them",
            err=True,
        )
        sys.exit(2)
    seed_list = list(range(first_seed, first_seed + count))
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
