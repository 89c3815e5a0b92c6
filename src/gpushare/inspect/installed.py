"""The installed extender's settings, read from its Deployment (pure).

``--explain`` must answer as the extender kube-scheduler calls, so it takes that extender's
policy, memory unit, pods per GPU and resource names. The chart does not keep them in a
ConfigMap: it passes them as flags of the ``extender`` container of the scheduler Deployment
(``--policy={{ .Values.policy }}``, ``--gpu-memory-unit``, ``--max-pods-per-gpu``, the
``--*-resource`` names, then ``scheduler.extraArgs``), so those flags are what is read here, the
last one of a name winning as it does for the extender's own parser. The values go through
``gpushare.config.load``, the path every component's flags take, so a value the extender would
refuse is refused here with the same message. The extender's ``--placeholder-namespace``
(the chart's ``autoscaling.placeholders``) is read beside them, for ``inspect.newnode``, and
the Secret its ``--seal-key-file`` is mounted from, so that ``--seal-secret`` needs no giving
under a release name other than ``gpushare`` (the Secret is ``<release>-seal``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpushare.config import ConfigError, load
from gpushare.core.decision.scheduling import Settings

FLAGS = {
    "--policy": "policy",
    "--gpu-memory-unit": "gpu_memory_unit",
    "--max-pods-per-gpu": "max_pods_per_gpu",
    "--mem-resource": "mem_resource",
    "--core-resource": "core_resource",
    "--count-resource": "count_resource",
}
"""The extender's flags that change what ``--explain`` computes, by their config field."""
PLACEHOLDER_FLAGS = {"--placeholder-namespace": "placeholder_namespace"}
"""The extender's flag naming where it keeps placeholder pods ('' or absent: it keeps none)."""


def flag_values(args: Sequence[str], flags: Mapping[str, str] = FLAGS) -> dict[str, str]:
    """The ``flags`` among a command line, ``--flag=value`` or ``--flag value``; the last wins."""
    values: dict[str, str] = {}
    i = 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        if name in flags:
            if not eq and i + 1 < len(args):
                i += 1
                value = args[i]
            values[flags[name]] = value
        i += 1
    return values


def _extender_args(deployment: Mapping[str, Any]) -> list[str] | None:
    spec = deployment.get("spec", {}).get("template", {}).get("spec", {})
    for container in spec.get("containers") or []:
        command = [*(container.get("command") or []), *(container.get("args") or [])]
        if "extender" in command:
            return [str(a) for a in command[command.index("extender") + 1 :]]
    return None


def extender_settings(
    deployments: Iterable[Mapping[str, Any]], namespace: str
) -> tuple[Settings, str]:
    """The settings of the extender a Deployment of ``namespace`` runs, and where they came
    from; ValueError when no Deployment runs one or its flags do not read."""
    for deployment in deployments:
        args = _extender_args(deployment)
        if args is None:
            continue
        name = deployment.get("metadata", {}).get("name", "")
        where = f"Deployment {namespace}/{name}"
        try:
            config = load(**flag_values(args))
        except ConfigError as err:
            raise ValueError(f"{where}: the extender's flags do not read: {err}") from None
        return config.settings(), where
    raise ValueError(f"no Deployment in namespace {namespace} runs the gpushare extender")


def placeholder_namespace(deployments: Iterable[Mapping[str, Any]]) -> str | None:
    """Where the extender a Deployment runs keeps its placeholder pods ('' when it keeps
    none); None when no Deployment runs one."""
    for deployment in deployments:
        args = _extender_args(deployment)
        if args is not None:
            return flag_values(args, PLACEHOLDER_FLAGS).get("placeholder_namespace", "")
    return None


SEAL_FLAG = {"--seal-key-file": "seal_key_file"}
"""The extender's flag naming the file of the seal key (a Secret volume's ``key``)."""


def seal_secret(deployments: Iterable[Mapping[str, Any]], namespace: str) -> str | None:
    """``NAMESPACE/NAME`` of the Secret mounted where the extender a Deployment runs reads its
    seal key (``--seal-key-file``); None when no Deployment runs one that reads it from a
    Secret volume."""
    for deployment in deployments:
        args = _extender_args(deployment)
        if args is None:
            continue
        key_file = flag_values(args, SEAL_FLAG).get("seal_key_file", "")
        spec = deployment.get("spec", {}).get("template", {}).get("spec", {})
        mounts = [
            m
            for c in spec.get("containers") or []
            for m in c.get("volumeMounts") or []
            if key_file.startswith(str(m.get("mountPath", "")).rstrip("/") + "/")
        ]
        volumes = {v.get("name"): v for v in spec.get("volumes") or []}
        for mount in mounts:
            secret = (volumes.get(mount.get("name")) or {}).get("secret") or {}
            if secret.get("secretName"):
                return f"{namespace}/{secret['secretName']}"
    return None


def describe(settings: Settings) -> str:
    """The settings as a short phrase for notes."""
    pods = settings.max_pods_per_gpu or "default"
    return f"policy {settings.policy}, unit {settings.unit.value}, max pods per GPU {pods}"
