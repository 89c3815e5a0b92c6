"""What only gpushare may write into a pod: hand-off annotations, isolation env, ``nodeName``.

A tenant who can create pods in their own namespace could otherwise take GPU nobody gave them,
without ever asking the scheduler:

- The hand-off annotations (``gpushare.io/*`` and ``ALIYUN_COM_GPU_MEM_*``) are what the ledger,
  the device plugin and ``kubectl inspect cgpu`` read as who holds what. A pod created with
  ``gpushare.io/allocation`` of 15 units against a limit of 1, or one that marks itself served
  (``ALIYUN_COM_GPU_MEM_ASSIGNED=true``), would be believed by all three.
- ``spec.nodeName`` at creation skips the scheduler, so no allocation is written and the device
  plugin has nothing true to serve the pod with.
- The variables the isolation sets (``LD_PRELOAD``, ``GPUSHARE_*``, ``CUDA_MPS_*``) turn the
  limits off when the container sets them itself: kubelet puts the container's own ``env`` after
  the device plugin's, and the last one wins. ``NVIDIA_VISIBLE_DEVICES`` makes the NVIDIA
  container runtime mount every GPU it names into *any* container, GPU request or not.
- The files the isolation mounts (the interposer, ``/etc/ld.so.preload``, the limits file, the
  broker's socket, the cGPU schedules, the MPS pipe directory: ``core.admitting.isolationpaths``,
  the one
  list the device plugin mounts from too) are shadowed by a volume mounted at the same path or
  below: kubelet lists the pod's volume mounts after the device plugin's, and runtimes mount
  them in that order (deeper paths later), so the pod's own wins.

- In DRA mode (docs/dra.md) the webhook marks a pod it converted with ``gpushare.io/dra-requests``
  and holds it with the scheduling gate ``gpushare.io/dra-allocation`` until gpushare's
  allocator has placed its claim. A tenant who lifts the gate itself has the stock allocator
  place the claim first-fit, out of gpushare's placement and its ResourcePolicies; so the gate
  may only be removed by the trusted identities, and the annotation is accepted on a new pod
  only beside the gate (a pod the webhook converted), never on its own.

So these are refused, by rules that are values (``OWNED_VARIABLES``) and outcomes that are
values (``Tampering``): each refusal names the field path, the value, the rule and what to do.

**Trust** goes by the requester the API server authenticated (``userInfo``), which a tenant
cannot choose: the extender's ServiceAccount writes the annotations at bind and removes them when
a bind fails, the device plugin's sets ``ASSIGNED``. Only they (``Trust``) may add, change or
remove hand-off annotations, or create a GPU pod with ``nodeName``. The env rules trust nobody:
no gpushare component creates pods.

**UPDATE judges only what changes.** An annotation kept at its value, or a variable a container
already had (pod containers are immutable and ephemeral ones cannot be removed), is not refused,
so ``kubectl label`` re-sending the whole object, finalizer removal and a second ``kubectl debug``
on a pod from before the webhook keep working; what is kept comes back as a warning. A merge
patch of annotations reaches admission as an UPDATE of the whole pod, ``oldObject`` before and
``object`` after, so the comparison sees exactly what the patch changed.

**Where the variables are refused.** ``NVIDIA_VISIBLE_DEVICES`` by its own rule
(``VisibleDevicesRule``), on every pod outside the namespaces exempt from it, except ``void`` and
``none`` on pods without gpushare resources, which hide GPUs. The others only on pods that ask
for gpushare resources: elsewhere they are ordinary (``LD_PRELOAD`` of jemalloc, a pod running
its own MPS with whole ``nvidia.com/gpu`` devices) and gpushare enforces nothing there to turn
off.

**Why ``NVIDIA_VISIBLE_DEVICES`` has a rule of its own.** The threat is a tenant's unprivileged
pod that sets it to ``all`` on a node whose NVIDIA runtime hook reads it (the toolkit's legacy
mode, or CDI mode turning the variable into CDI devices): the pod gets every GPU without asking
any scheduler. Whether that can happen is a node setting, not a pod's: with the NVIDIA Container
Toolkit's ``accept-nvidia-visible-devices-envvar-when-unprivileged = false`` the variable grants
an unprivileged container nothing, and GPUs reach containers as CDI devices the device plugin
names (the ``cdi-cri`` device-list strategy). The webhook cannot see that setting, and the
toolkit's default is ``true``, so by default (``auto``) the variable is refused from tenants
under either hand-off: under ``envvar``, which needs nodes that honour it, from every container;
under ``cdi-cri`` from unprivileged containers, the ones the setting is about (a privileged
container sees every device node of the host whatever the variable says, and refusing privilege
is Pod Security's job), so the GPU Operator's DaemonSets (device plugin, dcgm-exporter, GPU
feature discovery, validator: privileged, ``all``) pass in any namespace. Only ``allow``, for
clusters whose every node has the setting, lets tenants set it. NVIDIA's own unprivileged
components (NVIDIA's k8s-device-plugin) run in namespaces exempt by default.

**What admission cannot see.** ``envFrom`` takes names from a ConfigMap's or Secret's keys,
which are not in the pod (and can change after admission); only a ``prefix`` that can start an
owned name is refused. A variable in the image (CUDA images set ``NVIDIA_VISIBLE_DEVICES=all``)
or one a process unsets for its children never reaches the API server. Those need the node:
see docs/webhook.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from gpushare.core.admitting.isolationpaths import covered_by
from gpushare.core.model.names import (
    ANN_DRA_REQUESTS,
    DRA_SCHEDULING_GATE,
    SCHEDULER_NAME,
    ResourceNames,
)

HANDOFF_ANNOTATION_PREFIXES = ("gpushare.io/", "ALIYUN_COM_GPU_MEM_")
"""Pod annotation keys only gpushare's extender and device plugin write."""
ANNOTATION_RULE = (
    "gpushare.io/* and ALIYUN_COM_GPU_MEM_* annotations record the GPU a pod was given, and "
    "only gpushare's extender and device plugin write them"
)

CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
HIDING_VALUES = ("void", "none")
"""``NVIDIA_VISIBLE_DEVICES`` values that give a container no GPU (the NVIDIA runtime's words)."""
SHOWN_VALUE_CHARS = 120


@dataclass(frozen=True)
class OwnedVariable:
    """An environment variable (or, with ``prefix``, a family) that the isolation sets."""

    name: str
    prefix: bool
    everywhere: bool
    """Refused on every pod, not only on those asking for gpushare resources."""
    why: str
    fix: str = "remove it"
    scope: str = ""
    """Where the refusal holds, when not on every pod of every namespace (``, in namespace``)."""
    unprivileged_only: bool = False
    """Refused only from containers that are not privileged (``securityContext.privileged``)."""

    @property
    def shown(self) -> str:
        """``GPUSHARE_*`` for a family, the name otherwise."""
        return f"{self.name}*" if self.prefix else self.name

    def matches(self, variable: str) -> bool:
        """Whether the variable is this one (or of this family)."""
        return variable.startswith(self.name) if self.prefix else variable == self.name

    def reachable(self, env_from_prefix: str) -> bool:
        """Whether ``envFrom`` with this prefix can make the name from some key."""
        if self.prefix:
            return env_from_prefix.startswith(self.name) or self.name.startswith(env_from_prefix)
        return self.name.startswith(env_from_prefix) and self.name != env_from_prefix


VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"

OWNED_VARIABLES = (
    OwnedVariable(
        VISIBLE_DEVICES,
        prefix=False,
        everywhere=True,
        why="the NVIDIA container runtime mounts every GPU it names into the container, "
        "whichever scheduler placed the pod",
        fix="remove it (the device plugin sets it for pods that ask for gpushare resources, "
        "and 'void' or 'none' hide GPUs on other pods)",
    ),
    OwnedVariable(
        "LD_PRELOAD",
        prefix=False,
        everywhere=False,
        why="the device plugin preloads the GPU memory and compute interposer with it, and "
        "the container's own value replaces the plugin's",
        fix="remove it (set it in the container's command instead, `env LD_PRELOAD=... app`: "
        "gpushare also preloads its interposer through /etc/ld.so.preload, which that leaves "
        "in place)",
    ),
    OwnedVariable(
        "GPUSHARE_",
        prefix=True,
        everywhere=False,
        why="the device plugin gives the interposer the pod's limits in these, and the "
        "container's own value replaces the plugin's",
    ),
    OwnedVariable(
        "CUDA_MPS_",
        prefix=True,
        everywhere=False,
        why="the device plugin sets the MPS pipe directory and the MPS memory and thread "
        "limits in these, and the container's own value replaces the plugin's",
    ),
)


VisibleDevicesMode = Literal["auto", "refuse", "allow"]
"""How the webhook treats ``NVIDIA_VISIBLE_DEVICES`` (chart: ``webhook.nvidiaVisibleDevices``)."""
DeviceListStrategy = Literal["cdi-cri", "envvar", "driver-root"]
"""How the device plugin hands GPUs over (the chart's ``devicePlugin.deviceListStrategy``)."""
VISIBLE_DEVICES_MODES: tuple[str, ...] = get_args(VisibleDevicesMode)
DEVICE_LIST_STRATEGIES: tuple[str, ...] = get_args(DeviceListStrategy)
DEFAULT_EXEMPT_NAMESPACES = (
    "kube-system",
    "gpu-operator",
    "nvidia-gpu-operator",
    "nvidia-device-plugin",
)
"""Where NVIDIA's own components run: kube-system, the GPU Operator's namespace as its
documentation installs it (``gpu-operator``) and as OpenShift's OperatorHub does
(``nvidia-gpu-operator``), and NVIDIA's k8s-device-plugin chart's (``nvidia-device-plugin``).
The chart adds its release namespace."""


Cause = Literal["unset", "refuse", "envvar", "allow", "cdi-cri", "driver-root"]
"""What decided the rule: no setting, the mode itself, or ``auto`` beside a strategy."""
_BECAUSE: Mapping[str, str] = {
    "unset": "nothing tells the webhook that the nodes ignore it from unprivileged containers",
    "refuse": "the webhook is set to refuse it (nvidia-visible-devices mode refuse)",
    "envvar": "gpushare's device plugin hands GPUs over by this variable (device-list strategy "
    "envvar), so the nodes honour it from unprivileged containers",
    "allow": "the webhook is set to allow it",
    "cdi-cri": "the device plugin hands GPUs over by CDI (device-list strategy cdi-cri), where "
    "the variable is harmless only on nodes whose NVIDIA Container Toolkit ignores it from "
    "unprivileged containers, which the webhook cannot see",
    "driver-root": "the device plugin hands GPUs over as device nodes (device-list strategy "
    "driver-root), on nodes meant to have no NVIDIA runtime, which the webhook cannot see",
}


@dataclass(frozen=True)
class VisibleDevicesRule:
    """Whether ``NVIDIA_VISIBLE_DEVICES`` is refused, why, and in which namespaces it is not.

    The default refuses it everywhere but the exempt namespaces: a caller that says nothing
    about its nodes gets the reading that is safe on any node. ``resolve`` turns the chart's
    mode and device-list strategy into a rule.
    """

    cause: Cause = "unset"
    exempt: frozenset[str] = frozenset(DEFAULT_EXEMPT_NAMESPACES)

    @property
    def refused(self) -> bool:
        """Whether the variable is refused at all (outside the exempt namespaces)."""
        return self.cause != "allow"

    @property
    def unprivileged_only(self) -> bool:
        """Whether privileged containers may set it: ``auto`` beside CDI hand-off, where what
        the nodes' toolkit setting decides is what unprivileged containers get."""
        return self.cause in ("cdi-cri", "driver-root")

    @property
    def because(self) -> str:
        """Why it is refused or allowed, in words for messages and logs."""
        return _BECAUSE[self.cause]

    @classmethod
    def resolve(
        cls,
        mode: str,
        strategy: str,
        exempt: Iterable[str] = DEFAULT_EXEMPT_NAMESPACES,
    ) -> VisibleDevicesRule:
        """The rule for a mode (auto, refuse, allow) beside a device-list strategy.

        ``auto`` refuses it from every container when the device plugin hands GPUs over by the
        variable (``envvar``): then the nodes must honour it from unprivileged containers, and a
        tenant's own value would be honoured too. Under ``cdi-cri`` it refuses it from
        unprivileged containers: the toolkit setting that makes it grant them nothing is a
        node's, which the webhook cannot see (and the toolkit's default honours it).
        """
        if mode not in VISIBLE_DEVICES_MODES:
            raise ValueError(
                f"NVIDIA_VISIBLE_DEVICES mode {mode!r} is not one of "
                f"{', '.join(VISIBLE_DEVICES_MODES)}; write auto (refuse only when the device "
                f"plugin hands GPUs over by the variable), refuse or allow"
            )
        if strategy not in DEVICE_LIST_STRATEGIES:
            raise ValueError(
                f"device-list strategy {strategy!r} is not one of "
                f"{', '.join(DEVICE_LIST_STRATEGIES)}; write the strategy the device plugin "
                f"runs with (devicePlugin.deviceListStrategy)"
            )
        namespaces = frozenset(exempt)
        blank = sorted(n for n in namespaces if not n or n != n.strip())
        if blank:
            raise ValueError(
                f"exempt namespace {blank[0]!r} is not a namespace name; list names such as "
                f"gpu-operator, without spaces"
            )
        cause: Cause = "refuse" if mode == "refuse" else "allow"
        if mode == "auto":
            cause = "cdi-cri"
            if strategy == "envvar":
                cause = "envvar"
            elif strategy == "driver-root":
                cause = "driver-root"
        return cls(cause=cause, exempt=namespaces)

    def applies(self, namespace: str) -> bool:
        """Whether the variable is refused on a pod in this namespace."""
        return self.refused and namespace not in self.exempt

    def owned(self, namespace: str) -> tuple[OwnedVariable, ...]:
        """The variables refused in this namespace, ``NVIDIA_VISIBLE_DEVICES`` worded for it."""
        if not self.applies(namespace):
            return tuple(v for v in OWNED_VARIABLES if v.name != VISIBLE_DEVICES)
        exempt = ", ".join(sorted(self.exempt)) or "none"
        mode_fix = (
            "or hand GPUs over by CDI (devicePlugin.deviceListStrategy=cdi-cri) on nodes "
            "whose NVIDIA Container Toolkit sets accept-nvidia-visible-devices-envvar-when-"
            "unprivileged = false, where the variable grants an unprivileged pod nothing"
            if self.cause == "envvar"
            else "or, once every node's NVIDIA Container Toolkit sets accept-nvidia-visible-"
            "devices-envvar-when-unprivileged = false (the GPU Operator's toolkit.env "
            "ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED=false), set "
            "webhook.nvidiaVisibleDevices=allow with CDI hand-off"
        )
        who = " (from unprivileged containers)" if self.unprivileged_only else ""
        worded = OwnedVariable(
            VISIBLE_DEVICES,
            prefix=False,
            everywhere=True,
            unprivileged_only=self.unprivileged_only,
            scope=f"{who} in namespace {namespace!r}, which is not exempt from this rule",
            why=f"on a node whose NVIDIA runtime honours it from unprivileged containers it "
            f"mounts every GPU it names into the container, whichever scheduler placed the pod, "
            f"and {self.because}",
            fix=f"remove it ('void' or 'none' hide GPUs on a pod without gpushare resources); "
            f"a namespace that runs NVIDIA's own components (the GPU Operator, NVIDIA's device "
            f"plugin) belongs in the namespaces exempt from this rule "
            f"(webhook.nvidiaVisibleDevicesExemptNamespaces; now {exempt}); {mode_fix}",
        )
        return tuple(worded if v.name == VISIBLE_DEVICES else v for v in OWNED_VARIABLES)


@dataclass(frozen=True)
class Requester:
    """Who sent the request, as the API server authenticated them (``request.userInfo``)."""

    username: str = ""
    groups: tuple[str, ...] = ()

    @classmethod
    def from_user_info(cls, user_info: Any) -> Requester:
        """Read ``request.userInfo``; anything unreadable is nobody."""
        if not isinstance(user_info, Mapping):
            return cls()
        groups = user_info.get("groups")
        listed = tuple(g for g in groups if isinstance(g, str)) if isinstance(groups, list) else ()
        username = user_info.get("username")
        return cls(username=username if isinstance(username, str) else "", groups=listed)


@dataclass(frozen=True)
class TrustedWriters:
    """The identities whose hand-off writes pass: usernames and groups, exactly as spelled."""

    users: frozenset[str] = frozenset()
    """``system:serviceaccount:<namespace>:<name>`` of the extender and the device plugin."""
    groups: frozenset[str] = frozenset()

    def trusts(self, requester: Requester) -> bool:
        """Whether the requester is one of the trusted identities."""
        return requester.username in self.users or not self.groups.isdisjoint(requester.groups)


@dataclass(frozen=True)
class Tampering:
    """What the checks found: ``refused`` is new in this request, ``kept`` was there before."""

    refused: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Finding:
    key: tuple[str, ...]
    """What it is without list positions, to tell a kept finding on UPDATE from a new one."""
    message: str


@dataclass(frozen=True)
class Checked:
    """One pod (template) to check, with where it sits in the object the user wrote."""

    template: Mapping[str, Any]
    where: str = ""
    """``spec.template`` for a Job's pod template; empty for a Pod."""
    is_pod: bool = True
    old: Mapping[str, Any] | None = None
    """The template before an UPDATE; None on CREATE."""
    requester: Requester = field(default_factory=Requester)
    namespace: str = ""
    """The request's namespace, which ``VisibleDevicesRule`` may exempt."""


def _at(where: str, path: str) -> str:
    return f"{where}.{path}" if where else path


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_VALUE_CHARS else f"{text[:SHOWN_VALUE_CHARS]}...'"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _handoff(key: str) -> bool:
    return key.startswith(HANDOFF_ANNOTATION_PREFIXES)


def gpushare_resources(template: Mapping[str, Any], names: ResourceNames) -> tuple[str, ...]:
    """The gpushare resources any container asks for (under limits or requests), in order."""
    spec = _mapping(template.get("spec"))
    found: list[str] = []
    for kind in ("initContainers", "containers"):
        for container in spec.get(kind) or ():
            resources = _mapping(_mapping(container).get("resources"))
            for where in ("limits", "requests"):
                asked = _mapping(resources.get(where))
                found += [r for r in (names.mem, names.core) if r in asked and r not in found]
    return tuple(found)


def _containers(template: Mapping[str, Any]) -> Iterator[tuple[str, int, Mapping[str, Any]]]:
    spec = _mapping(template.get("spec"))
    for kind in CONTAINER_LISTS:
        items = spec.get(kind)
        for position, container in enumerate(items if isinstance(items, list) else ()):
            if isinstance(container, Mapping):
                yield kind, position, container


def _env_value(variable: Mapping[str, Any]) -> tuple[str, Any]:
    """(how the value is shown, the value for comparison)."""
    source = variable.get("valueFrom")
    if isinstance(source, Mapping) and source:
        kind = next(iter(source))
        return f"=valueFrom.{kind}", dict(source)
    value = variable.get("value", "")
    return f"={_shown(value)}", value


def _privileged(container: Mapping[str, Any]) -> bool:
    """Whether the container runs privileged (it sees every device node of the host)."""
    return _mapping(container.get("securityContext")).get("privileged") is True


def _env_findings(
    template: Mapping[str, Any],
    where: str,
    asked: tuple[str, ...],
    owned: tuple[OwnedVariable, ...] = OWNED_VARIABLES,
) -> list[_Finding]:
    findings: list[_Finding] = []
    gpu = f"a pod that asks for {asked[0]}" if asked else ""
    for kind, position, container in _containers(template):
        name = str(container.get("name") or "")
        at = f'container "{name}" ({_at(where, f"spec.{kind}[{position}]")}'
        privileged = _privileged(container)
        rules = tuple(r for r in owned if not (privileged and r.unprivileged_only))
        env = container.get("env")
        for index, variable in enumerate(env if isinstance(env, list) else ()):
            if not isinstance(variable, Mapping) or not isinstance(variable.get("name"), str):
                continue
            var = variable["name"]
            for rule in rules:
                if not rule.matches(var) or not (rule.everywhere or asked):
                    continue
                shown, value = _env_value(variable)
                if not asked and value in HIDING_VALUES:
                    continue
                scope = (f"on {gpu}" if asked else "on every pod") + rule.scope
                findings.append(
                    _Finding(
                        ("env", kind, name, var, repr(value)),
                        f"{at}.env[{index}]): {var}{shown} is refused {scope}: {rule.why}; "
                        f"{rule.fix}",
                    )
                )
        env_from = container.get("envFrom")
        for index, source in enumerate(env_from if isinstance(env_from, list) else ()):
            prefix = _mapping(source).get("prefix")
            if not isinstance(prefix, str) or not prefix:
                continue
            reachable = [r.shown for r in rules if (r.everywhere or asked) and r.reachable(prefix)]
            if reachable:
                names = ", ".join(r.shown for r in rules if r.everywhere or asked)
                findings.append(
                    _Finding(
                        ("envFrom", kind, name, prefix),
                        f"{at}.envFrom[{index}]): prefix {prefix!r} can make "
                        f"{' and '.join(reachable)} from the keys it imports, which is refused "
                        f"{f'on {gpu}' if asked else 'on every pod'}: only gpushare sets "
                        f"{'them' if len(reachable) > 1 else 'it'}; use a prefix that starts "
                        f"none of {names}",
                    )
                )
    return findings


def _mount_findings(
    template: Mapping[str, Any], where: str, asked: tuple[str, ...]
) -> list[_Finding]:
    if not asked:
        return []
    findings: list[_Finding] = []
    for kind, position, container in _containers(template):
        name = str(container.get("name") or "")
        mounts = container.get("volumeMounts")
        for index, mount in enumerate(mounts if isinstance(mounts, list) else ()):
            path = _mapping(mount).get("mountPath")
            if not isinstance(path, str) or not (covered := covered_by(path)):
                continue
            at = _at(where, f"spec.{kind}[{position}].volumeMounts[{index}]")
            findings.append(
                _Finding(
                    ("mount", kind, name, path),
                    f'container "{name}" ({at}): mountPath={path!r} is refused on a pod that '
                    f"asks for {asked[0]}: the device plugin mounts the GPU isolation at "
                    f"{covered}, and a volume at that path or below it replaces what the plugin "
                    f"put there; mount the volume elsewhere",
                )
            )
    return findings


def _annotations(template: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return _mapping(_mapping(_mapping(template).get("metadata")).get("annotations"))


def _gated(template: Mapping[str, Any] | None) -> bool:
    """Whether the pod (template) carries DRA mode's scheduling gate."""
    gates = _mapping(_mapping(template).get("spec")).get("schedulingGates")
    return any(
        _mapping(g).get("name") == DRA_SCHEDULING_GATE
        for g in (gates if isinstance(gates, list) else ())
    )


def _annotation_findings(checked: Checked) -> list[_Finding]:
    new = _annotations(checked.template)
    path = _at(checked.where, "metadata.annotations")
    findings: list[_Finding] = []
    if checked.old is None:
        # the webhook's own mark on a pod it converted: it grants nothing while the pod waits
        # behind the gate for gpushare's allocator, which reads the claim, not the annotation
        converted = _gated(checked.template)
        for key, value in new.items():
            if key == ANN_DRA_REQUESTS and converted:
                continue
            if _handoff(key):
                findings.append(
                    _Finding(
                        ("annotation", key),
                        f'{path}["{key}"]={_shown(value)} is refused: {ANNOTATION_RULE}; '
                        f"remove the annotation",
                    )
                )
        return findings
    old = _annotations(checked.old)
    who = f'by "{checked.requester.username}"'
    for key in sorted(k for k in {*old, *new} if _handoff(k)):
        before, after = old.get(key), new.get(key)
        if before == after:
            continue
        if before is None:
            what = f"added as {_shown(after)}"
        elif after is None:
            if not checked.is_pod:
                continue  # a template dropping a hand-off annotation makes its pods cleaner
            what = f"removed (it was {_shown(before)})"
        else:
            what = f"changed from {_shown(before)} to {_shown(after)}"
        findings.append(
            _Finding(
                ("annotation", key, what),
                f'{path}["{key}"] {what} {who}, which is not one of gpushare\'s trusted '
                f"identities: only gpushare's extender and device plugin may add, change or "
                f"remove gpushare.io/* and ALIYUN_COM_GPU_MEM_* annotations; leave it as it was",
            )
        )
    return findings


def _gate_findings(checked: Checked) -> list[_Finding]:
    """An untrusted UPDATE that lifts DRA mode's scheduling gate."""
    if checked.old is None or not _gated(checked.old) or _gated(checked.template):
        return []
    path = _at(checked.where, "spec.schedulingGates")
    return [
        _Finding(
            ("schedulingGate", DRA_SCHEDULING_GATE),
            f'{path}: the gate "{DRA_SCHEDULING_GATE}" removed by '
            f'"{checked.requester.username}", which is not one of gpushare\'s trusted identities: '
            f"only gpushare's DRA allocator lifts it, once it has placed the pod's claim (lifted "
            f"by anyone else, the stock allocator places the claim first-fit, outside gpushare's "
            f"placement and ResourcePolicies); leave the gate, gpushare lifts it",
        )
    ]


def _node_findings(checked: Checked, asked: tuple[str, ...], scheduler_name: str) -> list[_Finding]:
    node = _mapping(checked.template.get("spec")).get("nodeName")
    if not asked or not isinstance(node, str) or not node:
        return []
    before = _mapping(_mapping(checked.old).get("spec")).get("nodeName")
    if checked.old is not None and before == node:
        return []
    path = _at(checked.where, "spec.nodeName")
    return [
        _Finding(
            ("nodeName", node),
            f"{path}={node!r} is refused on a pod that asks for {asked[0]}: a pod placed "
            f"without the gpushare scheduler gets no GPU allocation, so the device plugin cannot "
            f"serve it truthfully and the GPU's ledger goes wrong; remove spec.nodeName and let "
            f"the scheduler place it (schedulerName: {scheduler_name}, with a nodeSelector or "
            f"node affinity to choose nodes)",
        )
    ]


def check(
    checked: Checked,
    *,
    names: ResourceNames,
    trust: TrustedWriters,
    scheduler_name: str = SCHEDULER_NAME,
    visible_devices: VisibleDevicesRule | None = None,
) -> Tampering:
    """Refuse what the request newly sets that only gpushare may write; keep the rest."""
    asked = gpushare_resources(checked.template, names)
    trusted = trust.trusts(checked.requester)
    owned = (visible_devices or VisibleDevicesRule()).owned(checked.namespace)
    new = _env_findings(checked.template, checked.where, asked, owned)
    new += _mount_findings(checked.template, checked.where, asked)
    if not trusted:
        new += _annotation_findings(checked) + _gate_findings(checked)
        new += _node_findings(checked, asked, scheduler_name)
    if checked.old is None:
        return Tampering(refused=tuple(f.message for f in new))
    before = {
        f.key
        for f in (
            *_env_findings(checked.old, checked.where, asked, owned),
            *_mount_findings(checked.old, checked.where, asked),
        )
    }
    return Tampering(
        refused=tuple(f.message for f in new if f.key not in before),
        kept=tuple(f.message for f in new if f.key in before),
    )
