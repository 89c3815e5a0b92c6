"""``gpushare extender``: the kube-scheduler extender over HTTP, on the API server's cluster.

The command only wires: settings from the flags (``cli.options``), the seal key
(``cli.sealing``), the API client, then the scheduler core, the cluster cache, the resource
policies' watch and the ASGI app; the HTTP server runs until the process is stopped. Its
``/metrics`` can also be served alone on a second port, for Prometheus to scrape when the
extender itself listens on 127.0.0.1 beside kube-scheduler.
"""

from __future__ import annotations

import functools
from typing import Any

import click

from gpushare.cli.autoscalingoptions import autoscaling_options, autoscaling_settings, leadership
from gpushare.cli.errors import CommandError
from gpushare.cli.logs import log_format_option, log_level_option, setup_logging
from gpushare.cli.options import resource_name_options, scheduling_config, scheduling_options
from gpushare.cli.scrapeaccess import metrics_access, metrics_access_options
from gpushare.cli.sealing import seal_options, trust_from_flags
from gpushare.core.model.names import SCHEDULER_NAME
from gpushare.extender.events import NORMAL_PER_S

EXTENDER_ROLE = (
    "the extender's ClusterRole (<release>-scheduler-extender, "
    "charts/gpushare/templates/scheduler-rbac.yaml)"
)
"""Where its verbs are granted, for the advice a refused watch logs."""


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=32766, show_default=True, type=int)
@click.option(
    "--kubeconfig", default=None, help="Path to a kubeconfig (default: in-cluster or $KUBECONFIG)."
)
@click.option("--context", default=None)
@log_level_option
@log_format_option
@click.option(
    "--metrics-port",
    type=int,
    default=0,
    show_default=True,
    help="Also serve /metrics alone on 0.0.0.0:PORT (0: only on --port), for Prometheus when "
    "--host is 127.0.0.1.",
)
@metrics_access_options
@click.option(
    "--packing-profile",
    default=SCHEDULER_NAME,
    show_default=True,
    help="The kube-scheduler profile (schedulerName) configured as `gpushare scheduler-config` "
    "writes it. For its GPU pods that state no node preference, filter answers with the top "
    "node alone and kube-scheduler skips scoring and prioritize. Give '' if that profile "
    "scores nodes with plugins of its own.",
)
@click.option(
    "--normal-events-per-second",
    type=click.FloatRange(min=0),
    default=NORMAL_PER_S,
    show_default=True,
    help="Cap on Normal Events (where a pod went), with a burst of five seconds' worth; past "
    "it they are skipped and counted in gpushare_events_skipped_total. Warnings (why a pod "
    "waits) are never capped. 0 writes no Normal Events.",
)
@scheduling_options
@resource_name_options
@seal_options
@autoscaling_options
@click.option(
    "--recreate-refused-pods/--no-recreate-refused-pods",
    default=True,
    show_default=True,
    help="Re-create, under the same name and with an event, a bare GPU pod that kubelet "
    "refused (UnexpectedAdmissionError) while its node's device plugin was not serving; a "
    "pod with a controller is left to it (docs/operations.md, 'Device plugin restarts').",
)
@click.option(
    "--dra-allocator/--no-dra-allocator",
    default=False,
    show_default=True,
    help="DRA mode (docs/dra.md): allocate the claims of pods gated with "
    "gpushare.io/dra-allocation with gpushare's placement, then remove the gate (the leading "
    "replica only, when --leader-lease is given: two replicas without it both allocate).",
)
@click.option(
    "--dra-ungate-refused/--no-dra-ungate-refused",
    default=False,
    show_default=True,
    help="With --dra-allocator: remove the gate of a pod no DRA node fits now, so that "
    "cluster-autoscaler (which scales only for ungated pods) adds a node; kube-scheduler's "
    "own allocator may then place it at the same moment as gpushare places another pod on "
    "the same GPU (docs/dra.md). Off: such pods stay gated until gpushare places them.",
)
def extender(
    host: str,
    port: int,
    metrics_port: int,
    metrics_authorization: bool,
    metrics_tls_cert_file: str | None,
    metrics_tls_private_key_file: str | None,
    metrics_auth_cache_ttl: float,
    kubeconfig: str | None,
    context: str | None,
    log_level: str,
    log_format: str,
    packing_profile: str,
    normal_events_per_second: float,
    gpu_memory_unit: str | None,
    policy: str | None,
    max_pods_per_gpu: int | None,
    mem_resource: str | None,
    core_resource: str | None,
    count_resource: str | None,
    seal_key_file: str | None,
    insecure_no_seal: bool,
    recreate_refused_pods: bool,
    dra_allocator: bool,
    dra_ungate_refused: bool,
    **autoscaling_flags: Any,
) -> None:
    """Serve the kube-scheduler extender (filter, prioritize, bind) over HTTP."""
    import asyncio

    import uvicorn

    from gpushare.core.decision.scheduling import Scheduler
    from gpushare.core.resourcepolicies.policybook import PolicyBook
    from gpushare.extender.app import create_app, create_metrics_app, server_config
    from gpushare.extender.autoscaling import Autoscaling
    from gpushare.extender.events import EventRecorder
    from gpushare.extender.readmitting import Readmitter
    from gpushare.extender.service import Extender
    from gpushare.kube.cache import ClusterCache
    from gpushare.kube.lightkube_api import LightkubeAPI
    from gpushare.kube.policies import PolicyWatch
    from gpushare.kube.port import KubeError
    from gpushare.kube.watchhealth import WatchHealth

    config = scheduling_config(
        gpu_memory_unit=gpu_memory_unit,
        policy=policy,
        max_pods_per_gpu=max_pods_per_gpu,
        mem_resource=mem_resource,
        core_resource=core_resource,
        count_resource=count_resource,
    )
    trust = trust_from_flags(seal_key_file, insecure_no_seal)
    try:
        api = LightkubeAPI.connect(kubeconfig, context)
    except KubeError as err:
        raise CommandError(str(err)) from None
    setup_logging(log_level, log_format)
    settings = config.settings()
    scheduler = Scheduler(settings)
    book = PolicyBook()
    # one place for every list and watch the extender runs: /readyz and the metrics read it
    health = WatchHealth(role=EXTENDER_ROLE)
    cache = ClusterCache(
        api, settings=settings, workload=scheduler.workload, trust=trust, book=book, health=health
    )
    events = EventRecorder(api, normal_per_s=normal_events_per_second)
    readmitter = Readmitter(
        api, names=settings.names, events=events, recreate=recreate_refused_pods
    )
    service = Extender(
        api=api,
        cache=cache,
        scheduler=scheduler,
        packing_profile=packing_profile,
        events=events,
        scheduler_reports=True,
        on_failed=readmitter.seen,
    )
    policies = PolicyWatch(api, book, notify=service.policy_notice, health=health)
    autoscaling_config = autoscaling_settings(settings, autoscaling_flags)
    autoscaling = (
        Autoscaling(api=api, state=cache.state, settings=autoscaling_config, events=events)
        if autoscaling_config is not None
        else None
    )
    allocator = None
    if dra_allocator:
        from gpushare.extender.draallocator import DraAllocator

        allocator = DraAllocator(
            api=api,
            state=cache.state,
            scheduler=scheduler,
            events=events,
            leading=functools.partial(leadership(autoscaling_flags).leading, api),
            book=book,
            health=health,
            ungate_refused=dra_ungate_refused,
        )
    app = create_app(
        service,
        run_cache=True,
        policies=policies,
        autoscaling=autoscaling,
        dra_allocator=allocator,
    )
    main_server = uvicorn.Server(server_config(app, host=host, port=port, log_level=log_level))
    if not metrics_port:
        main_server.run()
        return
    guard, cert = metrics_access(
        api,
        enabled=metrics_authorization,
        cert_file=metrics_tls_cert_file,
        key_file=metrics_tls_private_key_file,
        ttl_s=metrics_auth_cache_ttl,
        name="gpushare-extender",
    )
    metrics_config = server_config(
        create_metrics_app(service, guard),
        host="0.0.0.0",
        port=metrics_port,
        log_level=log_level,
        cert=cert,
    )

    async def both() -> None:
        metrics_server = uvicorn.Server(metrics_config)
        await asyncio.gather(main_server.serve(), metrics_server.serve())

    with asyncio.Runner(loop_factory=main_server.config.get_loop_factory()) as runner:
        runner.run(both())
