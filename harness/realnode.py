"""One real node beside the kwok nodes: containerd, runc, a real kubelet and the device plugin.

The control plane's fake nodes cannot start a container, so they cannot tell whether the device
plugin works with kubelet. This node can: containerd 2 is built from the Go module proxy at a
pinned release and kubelet from the same pinned Kubernetes modules as the control plane (both by
``controlplane/build.sh``), runc and the CNI plugins come from Debian's packages
(``node/setup.sh``), the pause and test images are built locally (``images.py``), and
``gpushare device-plugin --fake-gpus`` runs as a process registered with that kubelet. The facts
it depends on (settings, pitfalls) are in ``shared/docs/KUBELET.md``.

Choices, and why:

- containerd 2, because it is what GPU nodes run today and has CDI on by default: the plugin's
  ``cdi-cri`` strategy names CDI devices, kubelet passes them through CRI, and containerd applies
  the spec that ``cdi_double.py`` writes for the fake GPUs (each GPU's device node and one
  variable), so a container shows from inside which GPUs it got. Its CDI spec directory is the
  node's own, not ``/etc/cdi``: nothing on the host can add devices to the test's containers.
  ``containerd="debian"`` runs Debian's containerd 1.6 instead (no CDI), for the ``envvar``
  strategy's smoke test. ``driver_root=True`` is GKE's node shape (Container-Optimized OS): no
  CDI spec and no NVIDIA runtime, but a host driver directory holding the fake NVML as
  ``lib64/libnvidia-ml.so.1`` and a device directory of ``/dev/null``-numbered nodes
  (``nvidia<i>``, ``nvidiactl``, ``nvidia-uvm``); the plugin reads the GPUs through that NVML.

- kubelet authenticates callers by client certificate (the cluster CA) and authorizes every
  authenticated caller (``AlwaysAllow``): kube-apiserver reaches it with the admin certificate
  for ``kubectl logs``/``exec``, and nothing else on the loopback holds a CA-signed certificate.
- The node carries the taint ``gpushare-e2e/real-node:NoSchedule`` in tests, so the kwok tests'
  pods never land on it; the pods of the real-node tests tolerate it.
- kubelet always keeps device-plugin sockets in ``/var/lib/kubelet/device-plugins`` whatever its
  root directory, so one real node runs per machine; :func:`RealNode.stop` removes that directory.
- Process state is recorded in ``<root>/pids`` like the control plane's; ``cluster down`` stops
  what runs by command line (``reaping.py``: containerd, its shims, kubelet and the device plugin
  all name paths under ``<root>``) and then cleans up with :func:`clean_up_stopped`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpushare.node.gpus import FakeGpus
from harness import cdi_double
from harness.cluster import Cluster, Process, StartError, _openssl, wait_for
from harness.images import PAUSE_IMAGE, TEST_IMAGE, build_images
from harness.ports import free_port

HERE = Path(__file__).resolve().parent
SETUP = HERE / "node" / "setup.sh"
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
TAINT_KEY = "gpushare-e2e/real-node"
TOLERATION = {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
BRIDGE = "gse2e0"
SUBNET = "10.88.77.0/24"
"""The pods' addresses; the bridge of a ``gateway`` node takes the first, ``cluster.GATEWAY``."""
NODE_NAME = "gpushare-real-0"


def unavailable() -> str:
    """Why a real node cannot run on this machine, or ''."""
    if os.geteuid() != 0:
        return "the real node needs root (kubelet and containerd manage cgroups and mounts)"
    subprocess.run(["bash", str(SETUP)], check=False)
    for tool in ("runc", "containerd", "ctr", "gcc", "ip"):  # containerd 1.6: the envvar smoke
        if shutil.which(tool) is None:
            return f"{tool} is not installed (harness/node/setup.sh installs it as root)"
    if not Path("/usr/lib/cni/bridge").exists():
        return "the CNI plugins are not installed (Debian package containernetworking-plugins)"
    return ""


@dataclass
class RealNode:
    """A kubelet-backed node and its device plugin, started against a running :class:`Cluster`."""

    cluster: Cluster
    root: Path
    name: str = NODE_NAME
    mode: str = "share"
    fake_gpus: str = "4x15GiB"
    fake_topology: str = ""
    """``--fake-topology`` for the plugin (``core.model.topology.layout``); empty: none."""
    unit: str = "1GiB"
    taint: bool = True
    max_pods: int = 250
    plugin: bool = True
    plugin_identity: str = "chart"
    """``chart``: the plugin runs with a token of the chart's ServiceAccount bound to this node,
    under the chart's RBAC and node policies (harness.identities); ``admin``: the admin
    kubeconfig, for a test that needs it."""
    """Start ``gpushare device-plugin`` as a process here; False leaves the node to a device
    plugin that runs in a pod (the Helm chart's DaemonSet)."""
    gateway: bool = False
    """Give this machine an address on the pods' bridge (CNI ``isGateway``), so that the API
    server and kubelet's probes reach pod IPs (a webhook behind a Service)."""
    containerd: str = "v2"
    """``v2``: containerd 2 as ``controlplane/build.sh`` builds it, CDI on, spec directory
    :attr:`cdi_dir`; ``debian``: Debian's containerd 1.6, which has no CDI."""
    enable_cdi: bool = True
    """containerd 2's ``enable_cdi``: False gives the node of PLATFORMS.md gap 4, where the
    runtime drops the CDI names the plugin hands over."""
    hand_off_check: str = "refuse"
    """The plugin's ``--hand-off-check``, asked of this node's containerd (``--cri-socket``);
    empty: neither flag, for a plugin from before they existed."""
    device_list_strategy: str = field(
        default_factory=lambda: os.environ.get("GPUSHARE_E2E_DEVICE_LIST_STRATEGY", "cdi-cri")
    )
    """The plugin's ``--device-list-strategy``: ``cdi-cri`` (CDI devices by UUID, the plugin's
    default; containerd 2 only) or ``envvar`` (``NVIDIA_VISIBLE_DEVICES`` alone).
    ``GPUSHARE_E2E_DEVICE_LIST_STRATEGY`` sets it for a whole run, to compare the two."""
    driver_root: bool = False
    """GKE's shape: no CDI spec, the fake NVML in :attr:`driver_dir`, device nodes in
    :attr:`driver_dev_dir`. The plugin reads its GPUs through that NVML (``fake_gpus`` must then
    be ``<n>x16GiB``, the fake NVML's size; the UUIDs are the same as ``--fake-gpus`` gives),
    and is told ``--driver-root`` only under the ``driver-root`` strategy, as the chart does."""
    processes: dict[str, Process] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    _plugin_log_offset: int = 0

    # -- paths --------------------------------------------------------------------------------

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def cdi_dir(self) -> Path:
        """The only CDI spec directory containerd 2 reads here; the fake GPUs' spec lives in it."""
        return self.root / "cdi"

    @property
    def cdi_node_dir(self) -> Path:
        """The fake GPUs' device nodes on the host (``/dev/null``'s numbers)."""
        return self.root / "cdi-dev"

    def containerd_bin(self, name: str) -> str:
        """``containerd`` or ``ctr`` of the chosen containerd."""
        if self.containerd == "debian":
            return f"/usr/bin/{name}"
        return str(self.cluster.binaries[name])

    def fake_gpus_list(self) -> list[cdi_double.FakeGpu]:
        """The GPUs ``--fake-gpus`` gives the plugin, with the UUIDs it reports for them."""
        gpus = FakeGpus.parse(self.fake_gpus, node=self.name).gpus()
        return [cdi_double.FakeGpu(g.index, g.uuid) for g in gpus]

    def write_cdi_spec(self) -> Path:
        """(Re)write the fake GPUs' CDI spec for the current ``fake_gpus``; on a driver-root
        node, remove it instead (that shape has none) and write the driver root."""
        if self.driver_root:
            (self.cdi_dir / cdi_double.SPEC_FILE).unlink(missing_ok=True)
            return self.write_driver_root()
        return cdi_double.write(self.cdi_dir, self.cdi_node_dir, self.fake_gpus_list())

    @property
    def driver_dir(self) -> Path:
        """GKE's ``/home/kubernetes/bin/nvidia`` here: the fake NVML in ``lib64/``."""
        return self.root / "nvidia-driver"

    @property
    def driver_dev_dir(self) -> Path:
        """The host's ``/dev`` for the driver-root hand-off: ``/dev/null``-numbered GPU nodes."""
        return self.root / "nvidia-dev"

    def write_driver_root(self) -> Path:
        """Compile the fake NVML into the driver directory and make the device nodes."""
        from gpushare.isolation.build import compile_shared

        nvml = compile_shared(
            [HERE / "fakegpu" / "fakes" / "fake_nvml.c"],
            self.driver_dir / "lib64" / "libnvidia-ml.so.1",
            extra=("-Wl,-soname,libnvidia-ml.so.1",),
            libs=("-ldl",),
        )
        names = [f"nvidia{g.index}" for g in self.fake_gpus_list()]
        cdi_double.make_nodes(self.driver_dev_dir, [*names, "nvidiactl", "nvidia-uvm"])
        return nvml

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def pod_resources_socket(self) -> Path:
        return self.kubelet_root / "pod-resources" / "kubelet.sock"

    @property
    def state_dir(self) -> Path:
        return self.root / "gpushare-state"

    @property
    def lib_dir(self) -> Path:
        return self.root / "gpushare-lib"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet-config.yaml"

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Process:
        old = self.processes.get(name)
        if old is not None:
            old.stop()
        process = Process(name, argv, self.cluster.root / "logs" / f"{name}.log")
        process.start(env=env)
        self.processes[name] = process
        self._record()
        return process

    def _record(self) -> None:
        (self.root / "pids").write_text(
            "".join(f"{p.name} {p.pid}\n" for p in self.processes.values() if p.alive())
        )

    def ctr(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run containerd's ``ctr`` in the CRI namespace."""
        return subprocess.run(
            [
                self.containerd_bin("ctr"),
                "--address",
                str(self.containerd_socket),
                "-n",
                "k8s.io",
                *args,
            ],
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
        )

    # -- start --------------------------------------------------------------------------------

    def start(self, progress: Callable[[str], None] = lambda _: None) -> None:
        """containerd, images, kubelet, node Ready, device plugin, GPU capacity visible."""
        self.root.mkdir(parents=True, exist_ok=True)
        for name in ("kubelet", "kubelet-healthz"):
            self.ports[name] = free_port()
        try:
            progress("real node: images")
            cache = Path(os.environ.get("GPUSHARE_CACHE", Path.home() / ".cache" / "gpushare"))
            archives = build_images(cache / "images")
            progress("real node: containerd")
            self.start_containerd()
            for archive in archives.values():
                self.ctr("images", "import", str(archive))
            progress("real node: kubelet")
            self._write_kubelet_files()
            self.start_kubelet()
            self.wait_ready()
            if self.plugin:
                progress("real node: device plugin")
                self.start_plugin()
                self.wait_capacity()
        except BaseException:
            self.stop()
            raise

    def _containerd_config(self) -> str:
        if self.containerd == "debian":
            return self._containerd_1_6_config()
        return self._containerd_2_config()

    def _containerd_2_config(self) -> str:
        """containerd 2's version-3 configuration: what ``containerd config default`` (v2.2.9)
        shows, with this node's settings in place of the defaults.

        The 1.6 file's CRI section is split in two there: ``io.containerd.cri.v1.images``
        (snapshotter; the sandbox image, now ``pinned_images.sandbox``) and
        ``io.containerd.cri.v1.runtime`` (``restrict_oom_score_adj``, CDI, the runc runtime and
        its ``SystemdCgroup``, CNI). Keys left out keep their defaults. No drop-ins (containerd
        follows only the ``imports`` of the files it reads, so ``/etc/containerd/conf.d`` is not
        read, though ``config dump`` lists it) and NRI is off: nothing under ``/etc`` or
        ``/var/run`` of the host may change this node.
        """
        base = self.root / "containerd"
        images, runtime = (
            "plugins.'io.containerd.cri.v1.images'",
            "plugins.'io.containerd.cri.v1.runtime'",
        )
        return f"""version = 3
root = '{base / "root"}'
state = '{base / "state"}'
imports = []
disabled_plugins = ['io.containerd.snapshotter.v1.devmapper', 'io.containerd.snapshotter.v1.zfs',
  'io.containerd.snapshotter.v1.blockfile', 'io.containerd.snapshotter.v1.erofs',
  'io.containerd.internal.v1.tracing', 'io.containerd.nri.v1.nri']
[grpc]
  address = '{self.containerd_socket}'
[ttrpc]
  address = '{base / "containerd.ttrpc.sock"}'
[{images}]
  snapshotter = 'overlayfs'
  [{images}.pinned_images]
    sandbox = '{PAUSE_IMAGE}'
[{runtime}]
  # this VM lacks CAP_SYS_RESOURCE: runc cannot lower the sandbox's oom_score_adj
  restrict_oom_score_adj = true
  enable_selinux = false
  enable_cdi = {"true" if self.enable_cdi else "false"}
  cdi_spec_dirs = ['{self.cdi_dir}']
  [{runtime}.containerd]
    default_runtime_name = 'runc'
    [{runtime}.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [{runtime}.containerd.runtimes.runc.options]
        SystemdCgroup = false
  [{runtime}.cni]
    bin_dirs = ['/usr/lib/cni']
    conf_dir = '{base / "cni"}'
[plugins.'io.containerd.internal.v1.opt']
  path = '{base / "opt"}'
"""

    def _containerd_1_6_config(self) -> str:
        base = self.root / "containerd"
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        return f"""version = 2
root = "{base / "root"}"
state = "{base / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{self.containerd_socket}"
[ttrpc]
  address = "{base / "containerd.ttrpc.sock"}"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  # this VM lacks CAP_SYS_RESOURCE: runc cannot lower the sandbox's oom_score_adj
  restrict_oom_score_adj = true
  enable_selinux = false
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{base / "cni"}"
"""

    def start_containerd(self) -> None:
        """Start (or restart) containerd with the node's own configuration."""
        base = self.root / "containerd"
        (base / "cni").mkdir(parents=True, exist_ok=True)
        (base / "cni" / "10-gpushare-e2e.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "0.4.0",
                    "name": "gpushare-e2e",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": BRIDGE,
                            "isGateway": self.gateway,
                            "ipMasq": False,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": SUBNET}]],
                                "dataDir": str(base / "ipam"),
                            },
                        }
                    ],
                }
            )
        )
        config = base / "config.toml"
        config.write_text(self._containerd_config())
        env = None
        if self.containerd != "debian":
            self.write_cdi_spec()
            # containerd looks its shim up in PATH first: the one built beside it, not Debian's
            shim_dir = str(Path(self.containerd_bin("containerd")).parent)
            env = {**os.environ, "PATH": f"{shim_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        process = self._spawn(
            "containerd", [self.containerd_bin("containerd"), "--config", str(config)], env
        )
        wait_for(
            "containerd's socket",
            lambda: self.ctr("version", check=False).returncode == 0,
            60,
            process,
        )
        # containerd answers ctr before its CRI server has initialised, and kubelet, started in
        # that window, exits for good ("validate CRI v1 runtime API ... server is not
        # initialized yet"): wait until the CRI's own Version call answers.
        wait_for("containerd's CRI", self.cri_answers, 60, process)

    def cri_answers(self) -> bool:
        """Whether containerd's CRI server answers ``runtime.v1.RuntimeService/Version``.

        The request is a ``VersionRequest`` with no field set, which encodes as no bytes, so
        the call needs no generated CRI stubs; any answer, whatever its bytes, means ready.
        """
        import grpc

        with grpc.insecure_channel(f"unix://{self.containerd_socket}") as channel:
            version = channel.unary_unary(
                "/runtime.v1.RuntimeService/Version",
                request_serializer=lambda body: body,
                response_deserializer=lambda body: body,
            )
            try:
                version(b"", timeout=2)
            except grpc.RpcError:
                return False
        return True

    def _write_kubelet_files(self) -> None:
        pki = self.cluster.pki
        user = f"node-{self.name}"
        key, csr, ext = f"{user}.key", f"{user}.csr", f"{user}.ext"
        if not (pki / f"{user}.crt").exists():
            _openssl(
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                key,
                "-out",
                csr,
                "-subj",
                f"/O=system:nodes/CN=system:node:{self.name}",
                cwd=pki,
            )
            (pki / ext).write_text(
                "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            )
            _openssl(
                "x509",
                "-req",
                "-in",
                csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                f"{user}.crt",
                "-days",
                "365",
                "-extfile",
                ext,
                cwd=pki,
            )
        from harness.cluster import write_kubeconfig

        write_kubeconfig(self.root / "kubelet.kubeconfig", self.cluster.server, pki, user)
        config: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # this machine kind mounts cgroup v1; v1.36 refuses it unless told otherwise
            "failCgroupV1": False,
            "failSwapOn": False,
            "cgroupDriver": "cgroupfs",
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "address": "127.0.0.1",
            "port": self.ports["kubelet"],
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.ports["kubelet-healthz"],
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(pki / "ca.crt")},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "evictionHard": {
                "memory.available": "50Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
            },
            # the imported images cannot be pulled again: never collect them
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "podLogsDir": str(self.root / "pod-logs"),
            "maxPods": self.max_pods,
            "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "4s",
            "nodeStatusReportFrequency": "10s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "60s",
            "resolvConf": "",
            "cpuManagerPolicy": "none",
            "registerNode": True,
            "shutdownGracePeriod": "0s",
            "containerLogMaxSize": "1Mi",
        }
        if self.taint:
            config["registerWithTaints"] = [{"key": TAINT_KEY, "value": "true", **_no_schedule()}]
        self.kubelet_config.write_text(yaml.safe_dump(config, sort_keys=False))

    def start_kubelet(self) -> None:
        """Start (or restart) kubelet; the node registers itself with its mode label."""
        self.kubelet_root.mkdir(parents=True, exist_ok=True)
        labels = f"ack.node.gpu.schedule={self.mode},gpushare-e2e=real"
        self._spawn(
            "kubelet",
            [
                str(self.cluster.binaries["kubelet"]),
                f"--config={self.kubelet_config}",
                f"--kubeconfig={self.root / 'kubelet.kubeconfig'}",
                f"--root-dir={self.kubelet_root}",
                f"--cert-dir={self.root / 'kubelet-pki'}",
                f"--hostname-override={self.name}",
                "--node-ip=127.0.0.1",
                f"--node-labels={labels}",
                "--v=1",
            ],
        )

    def node(self) -> dict[str, Any]:
        node: dict[str, Any] = self.cluster.kubectl_json("get", "node", self.name)
        return node

    def ready(self) -> bool:
        """Whether the node reports Ready."""
        result = self.cluster.kubectl("get", "node", self.name, "-o", "json", check=False)
        if result.returncode != 0:
            return False
        conditions = json.loads(result.stdout).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def wait_ready(self, timeout: float = 120) -> None:
        """Until the node is Ready, then give it its loopback address.

        kubelet refuses a loopback node IP ("nodeIP can't be loopback address",
        pkg/kubelet/nodestatus/setters.go) and then leaves ``status.addresses`` alone, while
        without ``--node-ip`` it would publish this machine's own network address. Writing
        127.0.0.1 into the node status keeps ``kubectl logs`` and ``exec`` (the apiserver dials
        the node's InternalIP) on the loopback.
        """
        wait_for(f"node {self.name} Ready", self.ready, timeout, self.processes["kubelet"])
        patch = {
            "status": {
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": self.name},
                ]
            }
        }
        self.cluster.kubectl(
            "patch",
            "node",
            self.name,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps(patch),
        )

    def start_plugin(self, *, extra: tuple[str, ...] = ()) -> Process:
        """Start (or restart) ``gpushare device-plugin`` for this node."""
        gpushare = Path(sys.executable).parent / "gpushare"
        log = self.cluster.root / "logs" / "gpushare-device-plugin.log"
        self._plugin_log_offset = log.stat().st_size if log.exists() else 0
        if self.device_list_strategy == "cdi-cri" and self.containerd == "debian":
            raise StartError("the cdi-cri strategy needs containerd 2: Debian's 1.6 has no CDI")
        if self.containerd != "debian":
            self.write_cdi_spec()  # fake_gpus may have changed since containerd started
        gpus: tuple[str, ...] = ("--fake-gpus", self.fake_gpus)
        env = None
        if self.driver_root:
            gpus = ()
            if self.device_list_strategy == "driver-root":
                gpus = ("--driver-root", str(self.driver_dir))
                gpus += ("--dev-root", str(self.driver_dev_dir))
            uuids = ",".join(g.uuid for g in self.fake_gpus_list())
            env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
            env["FAKE_GPU_UUIDS"] = uuids  # the fake NVML's GPUs, named as --fake-gpus names them
        return self._spawn(
            "gpushare-device-plugin",
            [
                str(gpushare),
                "device-plugin",
                "--node-name",
                self.name,
                *gpus,
                "--gpu-memory-unit",
                self.unit,
                "--kubeconfig",
                str(self.plugin_kubeconfig()),
                "--device-plugin-dir",
                str(DEVICE_PLUGIN_DIR),
                "--pod-resources-socket",
                str(self.pod_resources_socket),
                "--state-dir",
                str(self.state_dir),
                "--isolation-lib-dir",
                str(self.lib_dir),
                "--kubelet-config",
                str(self.kubelet_config),
                "--cpu-manager-state",
                str(self.kubelet_root / "cpu_manager_state"),
                "--metrics-port",
                "0",
                "--fake-health-file",
                str(self.root / "fake-health"),
                "--device-list-strategy",
                self.device_list_strategy,
                "--cdi-spec-dirs",
                str(self.cdi_dir),
                "--cdi-hook-dir",
                str(self.cdi_dir),
                "--seal-key-file",
                str(self.cluster.seal_key),
                *(("--fake-topology", self.fake_topology) if self.fake_topology else ()),
                *(
                    (
                        "--hand-off-check",
                        self.hand_off_check,
                        "--cri-socket",
                        str(self.containerd_socket),
                    )
                    if self.hand_off_check
                    else ()
                ),
                *extra,
            ],
            env,
        )

    def start_dra_driver(self, *, extra: tuple[str, ...] = ()) -> Process:
        """Start (or restart) ``gpushare dra-driver`` for this node, with the chart's identity:
        kubelet's plugin directories under its root, claims' CDI specs in :attr:`cdi_dir`."""
        from harness.identities import dra_driver_kubeconfig

        gpushare = Path(sys.executable).parent / "gpushare"
        self.write_cdi_spec()
        return self._spawn(
            "gpushare-dra-driver",
            [
                str(gpushare),
                "dra-driver",
                "--node-name",
                self.name,
                "--fake-gpus",
                self.fake_gpus,
                "--fake-health-file",
                str(self.root / "fake-health"),
                "--gpu-memory-unit",
                self.unit,
                "--kubeconfig",
                str(dra_driver_kubeconfig(self.cluster, self.name)),
                "--plugins-dir",
                str(self.kubelet_root / "plugins"),
                "--registry-dir",
                str(self.kubelet_root / "plugins_registry"),
                "--state-dir",
                str(self.state_dir),
                "--isolation-lib-dir",
                str(self.lib_dir),
                "--cdi-dir",
                str(self.cdi_dir),
                "--cdi-spec-dirs",
                str(self.cdi_dir),
                "--device-list-strategy",
                self.device_list_strategy,
                *extra,
            ],
        )

    def plugin_kubeconfig(self) -> Path:
        """The credentials the plugin runs with (see ``plugin_identity``)."""
        if self.plugin_identity == "admin":
            return self.cluster.kubeconfig
        from harness.identities import device_plugin_kubeconfig

        return device_plugin_kubeconfig(self.cluster, self.name)

    def expect_registration(self) -> None:
        """Make :meth:`wait_capacity` wait for registrations logged from now on (after a
        kubelet restart the plugin registers again without restarting)."""
        log = self.cluster.root / "logs" / "gpushare-device-plugin.log"
        self._plugin_log_offset = log.stat().st_size if log.exists() else 0

    def gpu_count(self) -> int:
        return int(self.fake_gpus.split("x")[0]) if "x" in self.fake_gpus else 1

    def expected_mem(self) -> int:
        per_gpu = self.fake_gpus.split("x")[-1]
        gib = int(per_gpu.removesuffix("GiB"))
        return self.gpu_count() * gib * (8 if self.unit == "128MiB" else 1)

    def wait_capacity(self, timeout: float = 90) -> None:
        """Until kubelet reports the plugin's devices as allocatable on the node."""
        want = str(self.expected_mem())
        resources = 2 if self.mode == "core_mem" else 1
        log = self.cluster.root / "logs" / "gpushare-device-plugin.log"

        def visible() -> bool:
            with log.open("rb") as handle:
                handle.seek(self._plugin_log_offset)
                registered = handle.read().count(b"phase=register")
            if registered < resources:
                return False
            allocatable = self.node().get("status", {}).get("allocatable", {})
            if self.mode == "core_mem":
                core = str(100 * self.gpu_count())
                if allocatable.get("aliyun.com/gpu-core.percentage") != core:
                    return False
            return bool(allocatable.get("aliyun.com/gpu-mem") == want)

        wait_for(
            f"aliyun.com/gpu-mem={want} allocatable on {self.name}",
            visible,
            timeout,
            self.processes["gpushare-device-plugin"],
        )

    def set_mode(
        self,
        mode: str,
        *,
        unit: str | None = None,
        fake_gpus: str | None = None,
        extra: tuple[str, ...] = (),
    ) -> None:
        """Relabel the node and restart the plugin in the new mode (no pods may hold GPUs).

        A new unit restarts the extender with it too: the scheduler and the device plugin must
        count GPU memory in the same unit (the chart's one ``gpuMemoryUnit``). ``extra`` are
        more plugin flags, for this start only (``--cgpu-policy``).
        """
        if unit is not None and unit != self.cluster.extender_unit:
            self.cluster.start_extender(unit=unit)
        self.mode = mode
        if unit is not None:
            self.unit = unit
        if fake_gpus is not None:
            self.fake_gpus = fake_gpus
        self.cluster.kubectl(
            "label", "node", self.name, f"ack.node.gpu.schedule={mode}", "--overwrite"
        )
        self.start_plugin(extra=extra)
        self.wait_capacity()

    # -- restarts a test can inflict ----------------------------------------------------------

    def kill(self, name: str, sig: int = 9) -> None:
        """Send ``sig`` to one component (kubelet, containerd, gpushare-device-plugin)."""
        process = self.processes[name]
        if process.alive():
            os.kill(process.pid, sig)
            assert process.popen is not None
            process.popen.wait(timeout=30)

    def restart_plugin_timed(self, sig: int = 9, timeout: float = 90) -> float:
        """Kill the device plugin with ``sig``, start it again at once, and return the seconds
        from the signal until it has registered every resource with kubelet again (read from
        its log, polled every 20 ms): how long kubelet had no healthy device."""
        log = self.cluster.root / "logs" / "gpushare-device-plugin.log"
        resources = 2 if self.mode == "core_mem" else 1
        killed = time.monotonic()
        self.kill("gpushare-device-plugin", sig)
        process = self.start_plugin()
        while time.monotonic() - killed < timeout:
            with log.open("rb") as handle:
                handle.seek(self._plugin_log_offset)
                if handle.read().count(b"phase=register") >= resources:
                    return time.monotonic() - killed
            if not process.alive():
                raise StartError(f"the device plugin exited:\n{process.tail()}")
            time.sleep(0.02)
        raise StartError(f"the device plugin did not register within {timeout:.0f}s")

    # -- stop ---------------------------------------------------------------------------------

    def delete_pods(self) -> None:
        """Delete every pod bound to this node and wait (briefly) until kubelet has removed them."""
        selector = f"spec.nodeName={self.name}"
        self.cluster.kubectl(
            "delete",
            "pods",
            "--all-namespaces",
            f"--field-selector={selector}",
            "--grace-period=1",
            "--wait=false",
            check=False,
            timeout=120,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            left = self.cluster.kubectl(
                "get", "pods", "-A", f"--field-selector={selector}", "-o", "name", check=False
            ).stdout.split()
            if not left:
                return
            time.sleep(1)

    def stop(self) -> None:
        """Pods first, then the plugin, kubelet and containerd; then mounts, bridge, sockets."""
        if self.processes.get("kubelet") and self.processes["kubelet"].alive():
            with contextlib.suppress(Exception):
                self.delete_pods()
        for name in ("gpushare-device-plugin", "gpushare-dra-driver", "kubelet"):
            process = self.processes.get(name)
            if process is not None:
                process.stop()
        # the pods' containers live under containerd's shims, not under containerd itself
        if self.containerd_socket.exists():
            listing = self.ctr("tasks", "list", "-q", check=False).stdout.split()
            for task in listing:
                self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
        process = self.processes.get("containerd")
        if process is not None:
            process.stop()
        kill_shims(self.containerd_socket)
        self.processes.clear()
        # the Node object would stay NotReady with its GPUs counted by inspect and the extender
        with contextlib.suppress(Exception):
            self.cluster.kubectl("delete", "node", self.name, "--ignore-not-found", check=False)
        unmount_under(self.root)
        subprocess.run(["ip", "link", "del", BRIDGE], check=False, capture_output=True)
        shutil.rmtree(DEVICE_PLUGIN_DIR, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            (self.root / "pids").unlink()


def _no_schedule() -> dict[str, str]:
    return {"effect": "NoSchedule"}


def kill_shims(socket: Path) -> None:
    """SIGKILL the runc shims (and so the containers) of the containerd at ``socket``."""
    subprocess.run(
        ["pkill", "-9", "-f", f"containerd-shim-runc-v2 .*-address {socket}"],
        check=False,
        capture_output=True,
    )


def unmount_under(root: Path) -> None:
    """Lazily unmount everything mounted below ``root`` (deepest first)."""
    prefix = str(root.resolve()) + "/"
    mounts = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            target = line.split()[1].replace("\\040", " ")
            if target.startswith(prefix):
                mounts.append(target)
    for target in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", target], check=False, capture_output=True)


def clean_up_stopped(root: Path) -> None:
    """After ``cluster down`` stopped a real node's processes (found by their command lines, not
    by its pids file, which may be stale): its shims, mounts, bridge and plugin sockets."""
    with contextlib.suppress(FileNotFoundError):
        (root / "pids").unlink()
    kill_shims(root / "containerd" / "containerd.sock")
    unmount_under(root)
    subprocess.run(["ip", "link", "del", BRIDGE], check=False, capture_output=True)
    shutil.rmtree(DEVICE_PLUGIN_DIR, ignore_errors=True)


def pod(
    name: str,
    namespace: str,
    containers: list[dict[str, Any]],
    *,
    node: str = NODE_NAME,
    labels: dict[str, str] | None = None,
    init: list[dict[str, Any]] | None = None,
    restart: str = "Never",
) -> dict[str, Any]:
    """A pod for the real node: the local test image, the taint tolerated, quick to stop."""
    spec: dict[str, Any] = {
        "schedulerName": "ack-co-scheduler",
        "nodeSelector": {"kubernetes.io/hostname": node},
        "tolerations": [TOLERATION],
        "restartPolicy": restart,
        "terminationGracePeriodSeconds": 1,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "containers": [_local(c) for c in containers],
    }
    if init:
        spec["initContainers"] = [_local(c) for c in init]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {"app": "real"}},
        "spec": spec,
    }


def _local(container: dict[str, Any]) -> dict[str, Any]:
    return {"image": TEST_IMAGE, "imagePullPolicy": "Never", **container}


def container(
    name: str, mem: int | None = None, *, core: int | None = None, command: str = ""
) -> dict[str, Any]:
    """A container that prints what the device plugin gave it, then ``command`` (or exits)."""
    limits: dict[str, Any] = {}
    if mem is not None:
        limits["aliyun.com/gpu-mem"] = mem
    if core is not None:
        limits["aliyun.com/gpu-core.percentage"] = core
    script = "/probe; /probe > /dev/termination-log; " + (command or "true")
    return {
        "name": name,
        "command": ["/bin/sh", "-c", script],
        "resources": {"limits": limits},
    }


def probe_env(text: str) -> dict[str, str]:
    """The ``KEY=value`` lines /probe printed, plus ``PROBE_CDI_ENV``: the fake CDI devices'
    variables it saw, as ``index=uuid`` by index (:func:`cdi_double.seen`)."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    out["PROBE_CDI_ENV"] = cdi_double.seen(out)[1]
    return out


def hand_off(placed: list[int], uuids: dict[int, str], strategy: str) -> dict[str, str]:
    """What a container placed on the GPUs ``placed`` (in the allocation's order) must see
    from inside, for the plugin's device-list strategy.

    ``envvar``: the UUIDs in ``NVIDIA_VISIBLE_DEVICES`` and no device node (runc alone reads no
    variable). ``cdi-cri``: the variable ``void``, and exactly the placed GPUs' device nodes and
    CDI variables, which only containerd's CDI edits can have put there. ``driver-root``: the
    variable ``void`` and exactly the placed GPUs' device nodes (minor = index for the fake
    NVML), which only the Allocate answer's DeviceSpecs can have put there.
    """
    gpus = [cdi_double.FakeGpu(i, uuids[i]) for i in placed]
    if strategy == "cdi-cri":
        devices, cdi_env = cdi_double.expected(gpus)
        visible = "void"
    elif strategy == "driver-root":  # the placed GPUs' nodes, from the answer: no CDI edit
        devices, cdi_env = cdi_double.expected(gpus)[0], ""
        visible = "void"
    else:
        devices, cdi_env = "", ""
        visible = ",".join(g.uuid for g in gpus)
    return {"NVIDIA_VISIBLE_DEVICES": visible, "PROBE_DEVICES": devices, "PROBE_CDI_ENV": cdi_env}


__all__ = [
    "NODE_NAME",
    "TEST_IMAGE",
    "TOLERATION",
    "RealNode",
    "StartError",
    "clean_up_stopped",
    "container",
    "hand_off",
    "pod",
    "probe_env",
    "unavailable",
]
