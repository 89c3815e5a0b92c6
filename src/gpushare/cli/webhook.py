"""``gpushare webhook`` serves the admission webhook; ``gpushare webhook-config`` prints what
sends reviews to it.

Both take the same trust and steering flags (``--trusted-user``, ``--trusted-group``,
``--steer-from``, ``--no-steer``), so the configurations printed match the server they point
at. The webhook reads the memory unit and resource names through ``gpushare.config`` like the
extender, since it checks requests against the same rules the scheduler places them by.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from gpushare.cli.errors import CommandError
from gpushare.cli.logs import log_format_option, log_level_option, setup_logging
from gpushare.cli.options import resource_name_options, scheduling_config
from gpushare.core.admitting.tampering import (
    DEFAULT_EXEMPT_NAMESPACES,
    DEVICE_LIST_STRATEGIES,
    VISIBLE_DEVICES_MODES,
    VisibleDevicesRule,
)
from gpushare.core.admitting.tolerations import Toleration, parse_toleration
from gpushare.core.model.names import DEFAULT_SCHEDULER, SCHEDULER_NAME


def visible_devices_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The NVIDIA_VISIBLE_DEVICES rule's flags, shared by the server and its configuration.

    ``gpushare webhook-config`` takes them too: where the rule refuses nothing, the
    configuration sends the webhook no pod for setting the variable.
    """
    command = click.option(
        "--nvidia-visible-devices-exempt-namespace",
        "exempt_namespaces",
        multiple=True,
        default=list(DEFAULT_EXEMPT_NAMESPACES),
        show_default=True,
        help="Namespace where NVIDIA_VISIBLE_DEVICES is never refused, for NVIDIA's own components "
        "(repeatable; giving one replaces the defaults).",
    )(command)
    command = click.option(
        "--device-list-strategy",
        type=click.Choice(DEVICE_LIST_STRATEGIES),
        default="cdi-cri",
        show_default=True,
        help="How the device plugin hands GPUs over (the chart's devicePlugin.deviceListStrategy); "
        "only --nvidia-visible-devices auto reads it.",
    )(command)
    command = click.option(
        "--nvidia-visible-devices",
        type=click.Choice(VISIBLE_DEVICES_MODES),
        default="auto",
        show_default=True,
        help="NVIDIA_VISIBLE_DEVICES in a pod's env outside the exempt namespaces: refuse, allow, "
        "or auto (refuse it from every container under --device-list-strategy envvar, where the "
        "nodes must honour it, and from unprivileged ones under cdi-cri, where only the nodes' "
        "toolkit setting would make it harmless). The chart's webhook.nvidiaVisibleDevices.",
    )(command)
    return command


@click.command()
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
@resource_name_options
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
@click.option(
    "--steer-toleration",
    "steer_tolerations",
    multiple=True,
    help="A toleration POST /mutate adds to GPU pods that lack it, for tainted GPU nodes (GKE: "
    "nvidia.com/gpu:NoSchedule): key[=value][:effect] or a Toleration as JSON (repeatable; the "
    "chart's webhook.steer.tolerations). Pods naming --scheduler-name get them too.",
)
@click.option(
    "--dra",
    "dra_enabled",
    is_flag=True,
    help="Serve POST /mutate-dra and /mutate-dra-namespace: turn the ACK resources of pods in DRA "
    "mode into a claim, creating its ResourceClaimTemplate (the chart's dra.enabled; needs an API "
    "client: in-cluster or --kubeconfig).",
)
@click.option(
    "--dra-memory-unit",
    default="1GiB",
    show_default=True,
    help="What one aliyun.com/gpu-mem counts in DRA mode: 1GiB or 128MiB (dra.memoryUnit).",
)
@click.option(
    "--dra-default-mode",
    type=click.Choice(["device-plugin", "dra"]),
    default="device-plugin",
    show_default=True,
    help="dra: every new GPU pod outside the skipped namespaces is converted, not only those of "
    "namespaces labelled gpushare.io/allocation-mode=dra or selecting such nodes "
    "(dra.defaultMode).",
)
@click.option(
    "--dra-no-gate",
    is_flag=True,
    help="Leave the gpushare.io/dra-allocation scheduling gate off converted pods, for clusters "
    "where gpushare's DRA allocator does not run (the stock allocator then places claims).",
)
@click.option(
    "--kubeconfig", default=None, help="Path to a kubeconfig (default: in-cluster or $KUBECONFIG)."
)
@visible_devices_options
@log_level_option
@log_format_option
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
    steer_tolerations: tuple[str, ...],
    nvidia_visible_devices: str,
    device_list_strategy: str,
    exempt_namespaces: tuple[str, ...],
    dra_enabled: bool,
    dra_memory_unit: str,
    dra_default_mode: str,
    dra_no_gate: bool,
    kubeconfig: str | None,
    log_level: str,
    log_format: str,
) -> None:
    """Serve the admission webhook (POST /validate, POST /mutate) over HTTPS."""
    import asyncio
    from pathlib import Path

    from gpushare.core.admitting.admission import AdmissionSettings
    from gpushare.core.admitting.draconverting import DraSettings
    from gpushare.core.admitting.tampering import TrustedWriters
    from gpushare.core.model.units import MemoryUnit
    from gpushare.webhook.app import WebhookMetrics, create_app, serve, server_config
    from gpushare.webhook.certs import CertificateReloader

    scheduling = scheduling_config(
        gpu_memory_unit=gpu_memory_unit,
        max_pods_per_gpu=max_pods_per_gpu,
        mem_resource=mem_resource,
        core_resource=core_resource,
        count_resource=count_resource,
    ).settings()
    settings = AdmissionSettings(
        names=scheduling.names,
        unit=scheduling.unit,
        trust=TrustedWriters(users=frozenset(trusted_user), groups=frozenset(trusted_group)),
        scheduler_name=scheduler_name,
        steer_from=() if no_steer else tuple(steer_from),
        steer_tolerations=steer_tolerations_option(steer_tolerations),
        visible_devices=_visible_devices_rule(
            nvidia_visible_devices, device_list_strategy, exempt_namespaces
        ),
    )
    for flag, path in (
        ("--tls-cert-file", tls_cert_file),
        ("--tls-private-key-file", tls_private_key_file),
    ):
        if not Path(path).is_file():
            raise CommandError(f"{flag}={path!r} is not a readable file")
    dra = None
    templates = None
    if dra_enabled:
        try:
            unit = MemoryUnit.parse(dra_memory_unit)
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--dra-memory-unit") from None
        dra = DraSettings(unit=unit, default_dra=dra_default_mode == "dra", gate=not dra_no_gate)
        from gpushare.kube.lightkube_api import LightkubeAPI

        templates = LightkubeAPI.connect(kubeconfig)
    setup_logging(log_level, log_format)
    metrics = WebhookMetrics()
    app = create_app(settings, metrics, dra=dra, templates=templates)
    reloader = CertificateReloader(
        tls_cert_file,
        tls_private_key_file,
        reloads=metrics.certificate_reloads,
        loaded_at=metrics.certificate_loaded,
    )
    config = server_config(
        app,
        host=host,
        port=port,
        cert_file=tls_cert_file,
        key_file=tls_private_key_file,
        log_level=log_level,
        reloader=reloader,
    )
    asyncio.run(serve(config, reloader))


def steer_tolerations_option(texts: tuple[str, ...]) -> tuple[Toleration, ...]:
    """The --steer-toleration values, or the flag's error saying which one is wrong and why."""
    try:
        return tuple(parse_toleration(text) for text in texts)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--steer-toleration") from None


def _visible_devices_rule(mode: str, strategy: str, exempt: tuple[str, ...]) -> VisibleDevicesRule:
    """The NVIDIA_VISIBLE_DEVICES rule for the flags, or the flag's error saying what to write."""
    try:
        return VisibleDevicesRule.resolve(mode, strategy, exempt)
    except ValueError as err:
        raise click.BadParameter(
            str(err), param_hint="--nvidia-visible-devices-exempt-namespace"
        ) from None


@click.command("webhook-config")
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
    "--scheduler-name",
    default=SCHEDULER_NAME,
    show_default=True,
    help="gpushare's scheduler profile: with --steer-toleration, GPU pods naming it are sent to "
    "/mutate too.",
)
@click.option(
    "--steer-toleration",
    "steer_tolerations",
    multiple=True,
    help="A toleration the webhook adds to GPU pods that lack it, for tainted GPU nodes (GKE: "
    "nvidia.com/gpu:NoSchedule): key[=value][:effect] or a Toleration as JSON (repeatable; the "
    "chart's webhook.steer.tolerations).",
)
@click.option(
    "--steer-url",
    default=None,
    help="https://HOST:PORT/mutate; default: --url with /validate replaced by /mutate.",
)
@click.option(
    "--dra",
    is_flag=True,
    help="Also send new GPU pods in DRA mode to /mutate-dra-namespace and /mutate-dra (the "
    "webhook's own --dra; docs/dra.md), in front of steering.",
)
@click.option(
    "--dra-default-mode",
    type=click.Choice(["device-plugin", "dra"]),
    default="device-plugin",
    show_default=True,
    help="With --dra: dra sends every GPU pod outside the excluded namespaces (the webhook's "
    "own --dra-default-mode).",
)
@click.option("--mem-resource", default="aliyun.com/gpu-mem", show_default=True)
@click.option("--core-resource", default="aliyun.com/gpu-core.percentage", show_default=True)
@visible_devices_options
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
    scheduler_name: str,
    steer_tolerations: tuple[str, ...],
    steer_url: str | None,
    dra: bool,
    dra_default_mode: str,
    mem_resource: str,
    core_resource: str,
    nvidia_visible_devices: str,
    device_list_strategy: str,
    exempt_namespaces: tuple[str, ...],
) -> None:
    """Print the webhook configurations that send reviews to gpushare webhook.

    The ValidatingWebhookConfiguration, then (unless --no-steer, or with --dra) the
    MutatingWebhookConfiguration: DRA mode's webhooks (--dra) in front of the one for GPU pods
    that name no scheduler.
    """
    import base64
    from pathlib import Path

    import yaml

    from gpushare.core.model.names import ResourceNames
    from gpushare.webhook.configuration import (
        DEFAULT_EXCLUDED_NAMESPACES,
        PATH,
        STEERING_PATH,
        dra_webhooks,
        mutating_configuration,
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
    visible = _visible_devices_rule(nvidia_visible_devices, device_list_strategy, exempt_namespaces)
    if dra and url is not None and not url.endswith(PATH):
        raise click.BadParameter(
            f"{url!r} does not end in {PATH}, so the DRA webhooks' URLs (/mutate-dra, "
            f"/mutate-dra-namespace) cannot be derived from it; give https://HOST:PORT{PATH}",
            param_hint="--url",
        )
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
                url=url,
                trusted_users=trusted_user,
                trusted_groups=trusted_group,
                names=names,
                nvidia_visible_devices=visible.refused,
                nvidia_visible_devices_exempt=exempt_namespaces,
                **common,
            )
        ]
        mutating = []
        if dra:
            base = url.removesuffix(PATH) if url is not None else None
            mutating += dra_webhooks(url=base, names=names, default_mode=dra_default_mode, **common)
        if not no_steer:
            steering = steering_configuration(
                url=steer_url if url is not None else None,
                steer_from=steer_from,
                names=names,
                tolerating=scheduler_name if steer_tolerations_option(steer_tolerations) else "",
                **common,
            )
            mutating += steering["webhooks"]
        if mutating:
            documents.append(mutating_configuration(mutating))
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
