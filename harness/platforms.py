"""Managed platforms' node shapes, laid over the real node (``realnode.py``) and undone after.

A GKE, EKS, Bottlerocket, AKS, OpenShift, k3s or RKE2 GPU node differs from the kubeadm node
the chart was written for in a handful of ways (``shared/docs/PLATFORMS.md`` gives each with
its source, [Sn] below). Each way is reproduced here by itself, on this machine, without the
platform, so that a test can install the chart on the real node shaped like that platform's and
watch what users would see:

- :func:`read_only` — a read-only directory where the chart puts a host path: COS and
  Bottlerocket mount ``/`` (so ``/usr/local``) read-only [S3][S11]. kubelet's
  ``DirectoryOrCreate`` then fails to create ``isolation.libHostPath``.
- :func:`noexec` — a writable directory mounted ``noexec``: COS's ``/var`` and ``/home`` [S3].
  A bind mount keeps its source's per-mount flags, so the interposer the plugin mounts into a
  container from there cannot be mapped executable in it.
- :func:`driver_root` — no NVIDIA container runtime, the driver in a host directory instead
  (GKE's ``/home/kubernetes/bin/nvidia`` [S1]): ``lib64/libnvidia-ml.so.1`` built from the fake
  NVML, and a ``dev`` directory of character devices standing for ``/dev/nvidia*``. The real
  node never has an NVIDIA runtime, so ``NVIDIA_VISIBLE_DEVICES`` grants nothing on it: that is
  also the shape of a toolkit refusing the variable from unprivileged containers
  (Bottlerocket's ``accept-nvidia-visible-devices-envvar-when-unprivileged = false`` [S9]).
- :class:`OtherPlugin` — a second device plugin offering ``nvidia.com/gpu``, registered with the
  real kubelet over the device-plugin API, as GKE's, EKS's (eksctl), Bottlerocket's and AKS's
  managed plugins do [S2][S13][S10][S15].
- :func:`node_look` — a platform's node labels and taints (GKE's
  ``nvidia.com/gpu=present:NoSchedule`` [S8]).
- :func:`pod_security` — Pod Security enforcing a level on the release namespace (Rancher's
  restricted template, OpenShift's ``restricted-v2`` [S18][S19]).
- :func:`scc_defaults` — what OpenShift's ``restricted-v2`` SCC does to a pod that sets no ids:
  ``runAsUser`` and ``fsGroup`` from the namespace's range, by a MutatingAdmissionPolicy
  [S19]; the SCC's refusals are not reproduced.
- :func:`priority_quota` — GKE's admission configuration: pods of the two critical priority
  classes need a ResourceQuota covering them outside kube-system [S6] (the Kubernetes recipe
  "Limit Priority Class consumption by default").
- :class:`PlatformNode` — k3s's and RKE2's containerd socket (``/run/k3s/containerd``) and a
  ``nvidia`` runtime handler that is not the default (k3s pre-creates RuntimeClass ``nvidia``
  [S16]; OpenShift's operands use it [S19]). The real node's kubelet root already moves
  ``pod-resources`` while ``device-plugins`` stays in ``/var/lib/kubelet`` [S17].

Not reproducible here, and why: SELinux (this kernel runs none), OpenShift's SCC admission
itself (an OpenShift API server; only its defaulting of ids is reproduced), Bottlerocket's
toolkit settings and host-service plugin (its API), the platforms' ``osImage`` and
``providerID`` (kubelet reports this machine's; a node's providerID is set once).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.cluster import Cluster
from harness.realnode import DEVICE_PLUGIN_DIR, RealNode

HERE = Path(__file__).resolve().parent
FAKE_NVML = HERE / "fakegpu" / "fakes" / "fake_nvml.c"
K3S_CONTAINERD_SOCKET = Path("/run/k3s/containerd/containerd.sock")
NVIDIA_RUNTIME = "nvidia"


# -- mounts -------------------------------------------------------------------------------------


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise OSError(f"mount {' '.join(args)}: {done.stderr.strip()}")


@contextlib.contextmanager
def bind_over(path: Path, options: str) -> Iterator[Path]:
    """``path`` (created if missing) bind-mounted over itself with the per-mount ``options``
    (``ro``, ``noexec``); unmounted after, and removed if it was made here."""
    made = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    _mount("--bind", str(path), str(path))
    try:
        _mount("-o", f"remount,bind,{options}", str(path))
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)
        if made:
            shutil.rmtree(path, ignore_errors=True)


def read_only(path: Path) -> contextlib.AbstractContextManager[Path]:
    """``path`` read-only, as COS's and Bottlerocket's root file system [S3][S11]."""
    return bind_over(path, "ro")


def noexec(path: Path) -> contextlib.AbstractContextManager[Path]:
    """``path`` writable but not executable, as COS's ``/var`` and ``/home`` [S3]."""
    return bind_over(path, "noexec")


def mount_options(path: Path) -> set[str]:
    """The per-mount options of the mount ``path`` lies on (longest matching mount point)."""
    target, options = "", ""
    resolved = str(path.resolve())
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        point = fields[1].replace("\\040", " ")
        inside = resolved == point or resolved.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(target):
            target, options = point, fields[3]
    return set(options.split(","))


# -- a driver root holding the fake NVML ------------------------------------------------------


@dataclass(frozen=True)
class DriverRoot:
    """A host driver directory (``lib64/libnvidia-ml.so.1``) and the device nodes' directory."""

    root: Path
    dev: Path
    gpus: int

    @property
    def nvml(self) -> Path:
        return self.root / "lib64" / "libnvidia-ml.so.1"

    def device_nodes(self) -> list[str]:
        """The device nodes' names, as the driver makes them under ``/dev``."""
        return [
            *(f"nvidia{i}" for i in range(self.gpus)),
            "nvidiactl",
            "nvidia-uvm",
            "nvidia-uvm-tools",
        ]

    def uuids(self) -> list[str]:
        """The UUIDs its NVML reports without the fake driver (``fake_nvml.c``'s own two)."""
        return [f"GPU-fa4e0000-0000-4000-8000-{i:012d}" for i in range(self.gpus)]


def build_nvml(out: Path) -> Path:
    """``libnvidia-ml.so.1`` from the fake NVML, which names its GPUs itself when loaded
    without the fake driver (as a device plugin loads it)."""
    from gpushare.isolation import build

    return build.compile_shared(
        [FAKE_NVML],
        out,
        extra=("-Wl,-soname,libnvidia-ml.so.1",),
        libs=("-ldl",),
    )


@contextlib.contextmanager
def driver_root(base: Path, gpus: int = 2) -> Iterator[DriverRoot]:  # fake_nvml.c's two
    """A driver root at ``base`` (``lib64``) with its device nodes in ``base/dev``: each a
    character device 1:3 (``/dev/null``'s numbers, harmless to open), named as the driver names
    them. Removed after, with the parents made for it."""
    made = next((p for p in reversed([base, *base.parents]) if not p.exists()), None)
    found = DriverRoot(base, base / "dev", gpus)
    build_nvml(found.nvml)
    found.dev.mkdir(parents=True, exist_ok=True)
    for name in found.device_nodes():
        node = found.dev / name
        if not node.exists():
            os.mknod(node, 0o666 | 0o020000, os.makedev(1, 3))
            os.chmod(node, 0o666)  # whatever the umask
    try:
        yield found
    finally:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)


# -- a second plugin offering nvidia.com/gpu --------------------------------------------------


@dataclass
class OtherPlugin:
    """A device plugin serving ``resource`` (one healthy device per ``count``) on the real
    kubelet, registered over the device-plugin API as a managed platform's NVIDIA plugin is.
    Stopping it ends its stream: kubelet marks the devices unhealthy, allocatable drops to 0."""

    resource: str = "nvidia.com/gpu"
    count: int = 1
    plugin_dir: Path = DEVICE_PLUGIN_DIR
    endpoint: str = "platform-nvidia-gpu.sock"
    _server: Any = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> OtherPlugin:
        import grpc

        from gpushare.deviceplugin.kubelet.protos.v1beta1 import api_pb2 as dp
        from gpushare.deviceplugin.kubelet.protos.v1beta1 import api_pb2_grpc as dp_grpc

        stop, count = self._stop, self.count

        class Servicer(dp_grpc.DevicePluginServicer):
            def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
                return dp.DevicePluginOptions()

            def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
                devices = [dp.Device(ID=f"other-{i}", health="Healthy") for i in range(count)]
                yield dp.ListAndWatchResponse(devices=devices)
                while not stop.wait(1) and context.is_active():
                    pass

            def Allocate(self, request: Any, context: Any) -> Any:
                return dp.AllocateResponse(
                    container_responses=[
                        dp.ContainerAllocateResponse() for _ in request.container_requests
                    ]
                )

            def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
                return dp.PreferredAllocationResponse()

            def PreStartContainer(self, request: Any, context: Any) -> Any:
                return dp.PreStartContainerResponse()

        socket = self.plugin_dir / self.endpoint
        with contextlib.suppress(FileNotFoundError):
            socket.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        dp_grpc.add_DevicePluginServicer_to_server(Servicer(), server)
        server.add_insecure_port(f"unix://{socket}")
        server.start()
        self._server = server
        with grpc.insecure_channel(f"unix://{self.plugin_dir / 'kubelet.sock'}") as channel:
            dp_grpc.RegistrationStub(channel).Register(
                dp.RegisterRequest(
                    version="v1beta1", endpoint=self.endpoint, resource_name=self.resource
                ),
                timeout=10,
            )
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.stop(grace=1).wait(5)
        with contextlib.suppress(FileNotFoundError):
            (self.plugin_dir / self.endpoint).unlink()


# -- the node object, the namespace, the API server ------------------------------------------


@contextlib.contextmanager
def node_look(
    cluster: Cluster,
    node: str,
    *,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
) -> Iterator[None]:
    """The node with a platform's labels and extra taints; both taken off again after."""
    labels, taints = labels or {}, taints or []
    if labels:
        cluster.kubectl(
            "label", "node", node, "--overwrite", *(f"{k}={v}" for k, v in labels.items())
        )
    for taint in taints:
        cluster.kubectl("taint", "node", node, "--overwrite", _taint(taint))
    try:
        yield
    finally:
        for taint in taints:
            cluster.kubectl(
                "taint", "node", node, f"{taint['key']}:{taint['effect']}-", check=False
            )
        if labels:
            cluster.kubectl("label", "node", node, *(f"{k}-" for k in labels), check=False)


def _taint(taint: dict[str, str]) -> str:
    value = f"={taint['value']}" if taint.get("value") else ""
    return f"{taint['key']}{value}:{taint['effect']}"


PSA = "pod-security.kubernetes.io"


@contextlib.contextmanager
def pod_security(cluster: Cluster, namespace: str, level: str) -> Iterator[None]:
    """Pod Security enforcing ``level`` on ``namespace`` (created if missing); label removed
    after."""
    cluster.create_namespace(namespace, check=False)
    cluster.kubectl("label", "namespace", namespace, "--overwrite", f"{PSA}/enforce={level}")
    try:
        yield
    finally:
        cluster.kubectl("label", "namespace", namespace, f"{PSA}/enforce-", check=False)


SCC_RANGE_START = 1000680000
"""The first id of the range OpenShift gives a new namespace (its annotations'
``1000680000/10000``, the figure OpenShift's documentation shows)."""
SCC_ANNOTATIONS = {
    "openshift.io/sa.scc.uid-range": f"{SCC_RANGE_START}/10000",
    "openshift.io/sa.scc.supplemental-groups": f"{SCC_RANGE_START}/10000",
}


def scc_defaults_policy(namespace: str) -> list[dict[str, Any]]:
    """A MutatingAdmissionPolicy (admissionregistration.k8s.io/v1, on by default in 1.36) and
    its binding that do to ``namespace``'s pods what OpenShift's ``restricted-v2`` SCC does when
    it admits a pod that sets no ids [S19]: ``runAsUser`` (MustRunAsRange) and ``fsGroup``
    (MustRunAs) from the first id of the namespace's ranges, read from its annotations.

    Only the defaulting is reproduced: pods that only the ``privileged`` SCC would admit
    (a privileged container, ``hostPID``) are left alone, as that SCC's RunAsAny leaves them;
    SCC's refusals, SELinux labels and capability drops are not (the chart's SCC rules are
    checked as data by ``tests/integration/chart/test_openshift.py``)."""
    name = "gpushare-test-scc-restricted-v2"
    privileged = (
        "object.spec.containers.exists(c, has(c.securityContext) && "
        "has(c.securityContext.privileged) && c.securityContext.privileged)"
    )
    host_pid = "(has(object.spec.hostPID) && object.spec.hostPID)"
    context = "has(object.spec.securityContext)"
    field_or = (
        "{context} && has(object.spec.securityContext.{field}) ? "
        "object.spec.securityContext.{field} : variables.first"
    )
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods"],
                        }
                    ]
                },
                "matchConditions": [
                    {"name": "restricted-v2", "expression": f"!{privileged} && !{host_pid}"}
                ],
                "variables": [
                    {
                        "name": "first",
                        "expression": "int(namespaceObject.metadata.annotations"
                        "['openshift.io/sa.scc.uid-range'].split('/')[0])",
                    }
                ],
                "failurePolicy": "Fail",
                "reinvocationPolicy": "Never",
                "mutations": [
                    {
                        "patchType": "ApplyConfiguration",
                        "applyConfiguration": {
                            "expression": "Object{spec: Object.spec{securityContext: "
                            "Object.spec.securityContext{"
                            f"runAsUser: {field_or.format(context=context, field='runAsUser')}, "
                            f"fsGroup: {field_or.format(context=context, field='fsGroup')}"
                            "}}}"
                        },
                    }
                ],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        },
    ]


@contextlib.contextmanager
def scc_defaults(cluster: Cluster, namespace: str) -> Iterator[None]:
    """OpenShift's ``restricted-v2`` defaulting of ids on ``namespace`` (created if missing,
    given OpenShift's range annotations): :func:`scc_defaults_policy`. Removed after."""
    cluster.create_namespace(namespace, check=False)
    cluster.kubectl(
        "annotate", "namespace", namespace, "--overwrite",
        *(f"{k}={v}" for k, v in SCC_ANNOTATIONS.items()),
    )  # fmt: skip
    documents = scc_defaults_policy(namespace)
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps({"kind": "List", "apiVersion": "v1", "items": documents}),
    )
    # the API server loads policies from its informer: a server-side dry run shows when (a
    # pod Pod Security "restricted" admits, which the namespace may enforce)
    restricted = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "scc-defaults-probe", "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": "busybox", "securityContext": restricted}]},
    }
    deadline = time.monotonic() + 30
    while True:
        done = cluster.kubectl(
            "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(probe)
        )
        if json.loads(done.stdout)["spec"].get("securityContext", {}).get("runAsUser"):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"the SCC stand-in policy never applied to {namespace}'s pods")
        time.sleep(0.5)
    try:
        yield
    finally:
        for document in reversed(documents):
            kind = document["kind"].lower()
            cluster.kubectl(
                "delete", kind, document["metadata"]["name"], "--ignore-not-found", check=False
            )


CRITICAL_CLASSES = ("system-node-critical", "system-cluster-critical")


def admission_configuration() -> dict[str, Any]:
    """GKE's: pods of the critical priority classes are "limited resources" of the
    ResourceQuota admission plugin, so they need a quota whose scope names their class."""
    return {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": [
            {
                "name": "ResourceQuota",
                "configuration": {
                    "apiVersion": "apiserver.config.k8s.io/v1",
                    "kind": "ResourceQuotaConfiguration",
                    "limitedResources": [
                        {
                            "resource": "pods",
                            "matchScopes": [
                                {
                                    "scopeName": "PriorityClass",
                                    "operator": "In",
                                    "values": list(CRITICAL_CLASSES),
                                }
                            ],
                        }
                    ],
                },
            }
        ],
    }


@contextlib.contextmanager
def priority_quota(cluster: Cluster) -> Iterator[None]:
    """kube-apiserver restarted with GKE's admission configuration; restarted without it after.
    kube-system is given the quota GKE gives it, so only other namespaces feel the rule."""
    path = cluster.root / "admission-gke.json"
    path.write_text(json.dumps(admission_configuration()))
    saved = cluster.apiserver_extra
    cluster.apiserver_extra = (*saved, f"--admission-control-config-file={path}")
    cluster.restart_apiserver()
    cluster.kubectl("apply", "-f", "-", input=json.dumps(critical_quota("kube-system")))
    try:
        yield
    finally:
        cluster.apiserver_extra = saved
        cluster.restart_apiserver()


def critical_quota(namespace: str, name: str = "critical-pods") -> dict[str, Any]:
    """The ResourceQuota that lets pods of the critical classes into ``namespace`` (GKE's own
    in kube-system; NVIDIA documents the same for the GPU Operator's namespace [S6])."""
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "hard": {"pods": "1000"},
            "scopeSelector": {
                "matchExpressions": [
                    {
                        "scopeName": "PriorityClass",
                        "operator": "In",
                        "values": list(CRITICAL_CLASSES),
                    }
                ]
            },
        },
    }


def runtime_class(name: str = NVIDIA_RUNTIME) -> dict[str, Any]:
    """The RuntimeClass k3s creates when it finds the NVIDIA runtime [S16]."""
    return {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": name},
        "handler": name,
    }


# -- a node with k3s's containerd -------------------------------------------------------------


@dataclass
class PlatformNode(RealNode):
    """The real node with k3s's containerd socket (``/run/k3s/containerd/containerd.sock``)
    and a runtime handler named ``nvidia`` beside the default ``runc``. Here the handler is
    runc too: this machine has no NVIDIA runtime, so the handler stands for one only in name
    (what RuntimeClass ``nvidia`` selects), not in what it mounts."""

    socket: Path | None = K3S_CONTAINERD_SOCKET
    runtimes: tuple[str, ...] = (NVIDIA_RUNTIME,)

    @property
    def containerd_socket(self) -> Path:
        return self.socket or super().containerd_socket

    def _containerd_2_config(self) -> str:
        config = super()._containerd_2_config()
        runtime = "plugins.'io.containerd.cri.v1.runtime'"
        anchor = f"    [{runtime}.containerd.runtimes.runc]\n"
        extra = "".join(
            f"    [{runtime}.containerd.runtimes.{name}]\n"
            f"      runtime_type = 'io.containerd.runc.v2'\n"
            f"      [{runtime}.containerd.runtimes.{name}.options]\n"
            f"        SystemdCgroup = false\n"
            for name in self.runtimes
        )
        assert anchor in config, "realnode's containerd configuration changed its runc table"
        return config.replace(anchor, extra + anchor, 1)

    def start_containerd(self) -> None:
        if self.socket is not None:
            self.socket.parent.mkdir(parents=True, exist_ok=True)
        super().start_containerd()

    def stop(self) -> None:
        super().stop()
        if self.socket is not None:
            with contextlib.suppress(FileNotFoundError):
                self.socket.unlink()


# -- the platforms, as data ---------------------------------------------------------------------


@dataclass(frozen=True)
class Platform:
    """One platform's GPU node, as far as this machine can take its shape."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[dict[str, str], ...] = ()
    read_only: tuple[str, ...] = ()
    """Host directories that are read-only there (the chart's host paths must avoid them)."""
    noexec: tuple[str, ...] = ()
    """Writable host directories that are not executable there."""
    exec_exceptions: tuple[str, ...] = ()
    """Directories under a noexec one that are executable (COS remounts its driver's)."""
    driver_root: bool = False
    """No NVIDIA runtime: the driver sits in a host directory (GKE)."""
    runtime_class: str = ""
    """The NVIDIA runtime exists but is not the default: pods must name this RuntimeClass."""
    namespace_psa: str = ""
    """The Pod Security level a new namespace enforces by default there."""
    priority_quota: bool = False
    scc_defaults: bool = False
    """OpenShift's SCC admission gives the release namespace's pods their ids."""
    managed_plugin: str = ""
    """Who offers ``nvidia.com/gpu`` there unless told not to, and the switch that stops it."""
    switch: str = ""
    """Words of that switch a refusal beside the managed plugin must name."""
    reproduced: str = ""
    not_here: str = ""
    """What of the platform cannot be reproduced on this machine, and why."""

    def lib_dir_problem(self, path: str) -> str:
        """Why ``path`` cannot hold the interposer on this platform's nodes, or ''."""
        if any(_under(path, ro) for ro in self.read_only):
            return f"{path} is on a read-only file system there"
        if any(_under(path, d) for d in self.noexec) and not any(
            _under(path, e) for e in self.exec_exceptions
        ):
            return f"{path} is on a noexec file system there"
        return ""

    def state_dir_problem(self, path: str) -> str:
        """Why ``path`` cannot hold the plugin's state there, or ''."""
        if any(_under(path, ro) for ro in self.read_only):
            return f"{path} is on a read-only file system there"
        return ""


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


GKE_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}

PLATFORMS: dict[str, Platform] = {
    p.name: p
    for p in (
        Platform(
            "gke",
            labels={
                "cloud.google.com/gke-nodepool": "gpu-pool",
                "cloud.google.com/gke-accelerator": "nvidia-l4",
                "cloud.google.com/gke-os-distribution": "cos",
                "cloud.google.com/gke-gpu-driver-version": "disabled",
                "gke-no-default-nvidia-gpu-device-plugin": "true",
            },
            taints=(GKE_TAINT,),
            read_only=("/usr", "/etc", "/opt", "/lib", "/bin", "/sbin", "/boot"),
            noexec=("/var", "/home", "/tmp"),
            exec_exceptions=("/home/kubernetes/bin", "/var/lib/kubelet"),
            driver_root=True,
            priority_quota=True,
            managed_plugin="GKE's device plugin "
            "(node label gke-no-default-nvidia-gpu-device-plugin=true)",
            switch="gke-no-default-nvidia-gpu-device-plugin",
            reproduced="driver root + fake NVML, no NVIDIA runtime, read-only /usr/local, noexec "
            "/var, nvidia.com/gpu taint and labels, critical-priority quota admission, "
            "second plugin",
            not_here="osImage/providerID (kubelet reports this machine's); the webhook port on "
            "private clusters (one machine, no firewall between master and node)",
        ),
        Platform(
            "eks",
            labels={
                "eks.amazonaws.com/nodegroup": "gpu",
                "eks.amazonaws.com/compute-type": "ec2",
                "node.kubernetes.io/instance-type": "g5.xlarge",
            },
            managed_plugin="NVIDIA's plugin installed by eksctl (--install-nvidia-plugin=false)",
            switch="--install-nvidia-plugin=false",
            reproduced="second plugin; CDI through containerd 2 (nodeadm sets enable_cdi)",
            not_here="the NVIDIA runtime as the default (this machine has none); custom CNI "
            "reachability of the webhook",
        ),
        Platform(
            "bottlerocket",
            labels={
                "eks.amazonaws.com/nodegroup": "gpu-br",
                "node.kubernetes.io/instance-type": "g5.xlarge",
            },
            read_only=("/usr", "/etc", "/opt", "/lib", "/bin", "/sbin", "/boot"),
            managed_plugin="Bottlerocket's host plugin "
            "(settings.kubelet-device-plugins.nvidia.enabled=false)",
            switch="settings.kubelet-device-plugins.nvidia.enabled",
            reproduced="read-only /usr/local, the toolkit granting nothing for the variable "
            "(no NVIDIA runtime), CDI through containerd 2, second plugin",
            not_here="SELinux enforcing (this kernel runs none); the toolkit's and the host "
            "plugin's settings (Bottlerocket's API); osImage",
        ),
        Platform(
            "aks",
            labels={
                "kubernetes.azure.com/agentpool": "gpupool",
                "kubernetes.azure.com/accelerator": "nvidia",
                "node.kubernetes.io/instance-type": "Standard_NC4as_T4_v3",
            },
            managed_plugin="AKS-managed GPU pool's plugin (--gpu-driver none / standard pool)",
            switch="gpu-driver",
            reproduced="second plugin; CDI through containerd 2",
            not_here="the AKS GPU image's toolkit runtime; ExtendedResourceToleration absent",
        ),
        Platform(
            "openshift",
            labels={"node.openshift.io/os_id": "rhcos"},
            runtime_class=NVIDIA_RUNTIME,
            namespace_psa="restricted",
            scc_defaults=True,
            reproduced="Pod Security restricted on the namespace, RuntimeClass nvidia, "
            "restricted-v2's ids from the namespace's range (a MutatingAdmissionPolicy)",
            not_here="SCC admission's refusals (needs OpenShift's API server: the SCC rules are "
            "checked as data), SELinux, CRI-O",
        ),
        Platform(
            "k3s",
            labels={"node.kubernetes.io/instance-type": "k3s"},
            runtime_class=NVIDIA_RUNTIME,
            reproduced="/run/k3s/containerd socket, RuntimeClass nvidia not default, moved "
            "kubelet root (pod-resources moves, device-plugins stays)",
            not_here="k3s's embedded containerd itself",
        ),
        Platform(
            "rke2",
            labels={"node.kubernetes.io/instance-type": "rke2"},
            runtime_class=NVIDIA_RUNTIME,
            namespace_psa="restricted",
            reproduced="as k3s, plus Pod Security restricted outside the exemption list",
            not_here="the CIS profile's other settings",
        ),
        Platform(
            "kubeadm",
            managed_plugin="the GPU Operator's plugin (nvidia.com/gpu.deploy.device-plugin=false)",
            switch="nvidia.com/gpu.deploy.device-plugin=false",
            reproduced="the documented path: CDI through containerd 2, second plugin",
        ),
    )
}


__all__ = [
    "K3S_CONTAINERD_SOCKET",
    "PLATFORMS",
    "DriverRoot",
    "OtherPlugin",
    "Platform",
    "PlatformNode",
    "admission_configuration",
    "bind_over",
    "build_nvml",
    "critical_quota",
    "driver_root",
    "mount_options",
    "node_look",
    "noexec",
    "pod_security",
    "priority_quota",
    "read_only",
    "runtime_class",
    "scc_defaults",
    "scc_defaults_policy",
]
