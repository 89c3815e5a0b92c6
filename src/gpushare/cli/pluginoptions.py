"""``gpushare device-plugin``'s flags, validated once into one frozen value.

The command's flags (and the chart's environment behind some of them) are checked here, all of
them, before anything reads the node: the cGPU policy and pods per GPU, the device-list strategy
and CDI kind, the accounting broker's caps against the open-file limit, a fake topology without
fake GPUs, the startup taint's key, and the scheduling settings (through ``gpushare.config``, as
the extender reads the same values). A flag that does not parse is click's ``BadParameter``
naming the flag; values that do not go together are a ``CommandError``; either message names the
value, the rule and what to change. What only the node can say (the seal key file, kubelet's CPU
manager, the GPUs, the API server) is checked by the builder (``cli.deviceplugin.build_plugin``).
The flags ``gpushare dra-driver`` shares with it (the cGPU policy, pods per GPU and hand-off) are
parsed by :func:`isolation_flags`, for both commands.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from gpushare.cli.errors import CommandError
from gpushare.cli.options import scheduling_config
from gpushare.core.decision.scheduling import Settings
from gpushare.core.model.startuptaint import STARTUP_TAINT, key_problem
from gpushare.isolation.policy import Policy, PolicyError, parse_max_pods, parse_policy
from gpushare.node.cdi import HandOff, HandOffError, Strategy, parse_kind, parse_strategy
from gpushare.node.descriptors import BrokerCaps, CapsError, descriptor_limit
from gpushare.node.driverroot import DriverRoot
from gpushare.node.handoffproof import Mode as HandOffCheck


@dataclass(frozen=True)
class MetricsAccess:
    """Who may scrape ``/metrics`` (``cli.scrapeaccess``'s flags)."""

    enabled: bool
    cert_file: str | None
    key_file: str | None
    ttl_s: float


@dataclass(frozen=True)
class PluginOptions:
    """Everything ``gpushare device-plugin`` was told, validated; the builder's only input."""

    node: str
    settings: Settings
    """The memory unit, pods per GPU and resource names, as ``gpushare.config`` validated them."""
    max_pods: int | None
    """``--max-pods-per-gpu`` as given (None: the unit's default), for cGPU's max_inst."""
    cgpu_policy: Policy
    caps: BrokerCaps
    handoff: HandOff
    """The device-list strategy, CDI kind and spec directories (it caches the specs it reads)."""
    hand_off_check: HandOffCheck
    """``--hand-off-check``: refuse, warn or off when the runtime ignores the hand-off."""
    cri_socket: Path
    toolkit_config: Path
    cdi_spec_host_dirs: tuple[Path, ...]
    """The CDI spec directories as the host (and so the runtime) names them, in the order of
    ``handoff.spec_dirs``."""
    isolation: str
    plugin_dir: Path
    pod_resources_socket: Path
    state_dir: Path
    isolation_lib_dir: Path
    cdi_hook_dir: Path
    kubelet_config: Path
    cpu_manager_state: Path
    kubeconfig: str | None
    fake_gpus: str | None
    fake_health_file: Path | None
    fake_topology: str
    startup_taint: str
    """The taint key removed once kubelet allocates the GPU memory; empty: none."""
    metrics_port: int
    metrics: MetricsAccess
    health_port: int
    used_summary_interval_s: float
    seal_key_file: str | None
    insecure_no_seal: bool
    log_level: str
    log_format: str

    @classmethod
    def from_flags(cls, flags: Mapping[str, Any]) -> PluginOptions:
        """The options the click flags give; raises BadParameter or CommandError with the rule."""
        given = isolation_flags(flags)
        policy, max_pods, handoff = given.cgpu_policy, given.max_pods, given.handoff
        try:
            caps = BrokerCaps(
                per_pod=flags["broker_max_connections_per_pod"],
                per_node=flags["broker_max_connections_per_node"],
                kept=flags["broker_min_connections_per_container"],
                idle_s=flags["broker_idle_timeout"],
                descriptors=descriptor_limit(),
            )
        except CapsError as err:
            raise CommandError(str(err)) from None
        if flags["fake_topology"] and not flags["fake_gpus"]:
            raise CommandError("--fake-topology describes fake GPUs; give --fake-gpus too")
        # An empty resource name keeps the default, as an unset one does.
        settings = scheduling_config(
            gpu_memory_unit=flags["gpu_memory_unit"],
            max_pods_per_gpu=max_pods,
            mem_resource=flags["mem_resource"] or None,
            core_resource=flags["core_resource"] or None,
            count_resource=flags["count_resource"] or None,
        ).settings()
        host_dirs = tuple(
            Path(d.strip()) for d in (flags["cdi_spec_host_dirs"] or "").split(",") if d.strip()
        ) or tuple(handoff.spec_dirs)
        if len(host_dirs) != len(handoff.spec_dirs):
            raise click.BadParameter(
                f"{len(host_dirs)} host director(ies) for {len(handoff.spec_dirs)} in "
                "--cdi-spec-dirs: give one host path per spec directory, in the same order",
                param_hint="--cdi-spec-host-dirs",
            )
        health_file = flags["fake_health_file"]
        taint = flags["startup_taint"].strip()
        problem = key_problem(taint)
        if problem:
            raise click.BadParameter(
                f"{taint!r} is not a taint key: {problem}; give a key such as {STARTUP_TAINT}, "
                "the one the node pool puts on its new nodes, or '' for none",
                param_hint="--startup-taint",
            )
        return cls(
            node=flags["node_name"],
            settings=settings,
            max_pods=max_pods,
            cgpu_policy=policy,
            caps=caps,
            handoff=handoff,
            hand_off_check=HandOffCheck(flags["hand_off_check"]),
            cri_socket=Path(flags["cri_socket"]),
            toolkit_config=Path(flags["toolkit_config"]),
            cdi_spec_host_dirs=host_dirs,
            isolation=flags["isolation"],
            plugin_dir=Path(flags["device_plugin_dir"]),
            pod_resources_socket=Path(flags["pod_resources_socket"]),
            state_dir=Path(flags["state_dir"]),
            isolation_lib_dir=Path(flags["isolation_lib_dir"]),
            cdi_hook_dir=Path(flags["cdi_hook_dir"]),
            kubelet_config=Path(flags["kubelet_config"]),
            cpu_manager_state=Path(flags["cpu_manager_state"]),
            kubeconfig=flags["kubeconfig"],
            fake_gpus=flags["fake_gpus"],
            fake_health_file=Path(health_file) if health_file else None,
            fake_topology=flags["fake_topology"],
            startup_taint=taint,
            metrics_port=flags["metrics_port"],
            metrics=MetricsAccess(
                enabled=flags["metrics_authorization"],
                cert_file=flags["metrics_tls_cert_file"],
                key_file=flags["metrics_tls_private_key_file"],
                ttl_s=flags["metrics_auth_cache_ttl"],
            ),
            health_port=flags["health_port"],
            used_summary_interval_s=flags["used_summary_interval"],
            seal_key_file=flags["seal_key_file"],
            insecure_no_seal=flags["insecure_no_seal"],
            log_level=flags["log_level"],
            log_format=flags["log_format"],
        )


@dataclass(frozen=True)
class IsolationFlags:
    """The isolation and hand-off flags both node drivers take (``node_driver_options``)."""

    cgpu_policy: Policy
    max_pods: int | None
    """``--max-pods-per-gpu`` as given (None: the unit's default), for cGPU's max_inst."""
    handoff: HandOff
    """The device-list strategy, CDI kind and spec directories (it caches the specs it reads)."""


def isolation_flags(flags: Mapping[str, Any]) -> IsolationFlags:
    """The cGPU policy, pods per GPU and hand-off the flags give; BadParameter naming the flag.

    One parser for ``gpushare device-plugin`` and ``gpushare dra-driver``, so a node refuses the
    same values with the same message whichever mode it runs in.
    """
    try:
        policy = parse_policy(flags["cgpu_policy"], "--cgpu-policy (GPUSHARE_ISOLATION_POLICY)")
    except PolicyError as err:
        raise click.BadParameter(str(err), param_hint="--cgpu-policy") from None
    given_max = flags["max_pods_per_gpu"]
    try:
        max_pods = None if given_max is None else parse_max_pods(given_max)
    except PolicyError as err:
        raise click.BadParameter(str(err), param_hint="--max-pods-per-gpu") from None
    try:
        handoff = HandOff(
            strategy=parse_strategy(flags["device_list_strategy"]),
            kind=parse_kind(flags["cdi_kind"]),
            spec_dirs=tuple(
                Path(d.strip()) for d in flags["cdi_spec_dirs"].split(",") if d.strip()
            ),
            driver_root=driver_root_of(flags),
        )
    except HandOffError as err:
        raise click.BadParameter(str(err)) from None
    return IsolationFlags(cgpu_policy=policy, max_pods=max_pods, handoff=handoff)


def driver_root_of(flags: Mapping[str, Any]) -> DriverRoot | None:
    """``--driver-root`` and its companions; None when not given (HandOffError: why not valid)."""
    root = flags.get("driver_root") or ""
    strategy = flags["device_list_strategy"]
    if not root:
        if strategy == Strategy.DRIVER_ROOT:
            raise HandOffError(
                "--device-list-strategy driver-root needs --driver-root: the host directory the "
                "NVIDIA driver installer fills (GKE: /home/kubernetes/bin/nvidia), mounted at the "
                "same path in the plugin (the chart's devicePlugin.driverRoot.hostPath)"
            )
        return None
    paths = {
        "--driver-root": root,
        "--driver-root-container-path": flags.get("driver_root_container_path") or "",
        "--dev-root": flags.get("dev_root") or "",
    }
    for name, value in paths.items():
        if not value.startswith("/"):
            raise HandOffError(
                f"{name}={value!r} is not an absolute path: give the directory from the root, "
                f"as in /home/kubernetes/bin/nvidia, /usr/local/nvidia or /dev"
            )
    return DriverRoot(
        Path(root),
        container_path=Path(paths["--driver-root-container-path"]),
        dev_root=Path(paths["--dev-root"]),
    )
