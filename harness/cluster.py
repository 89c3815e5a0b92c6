"""A real Kubernetes control plane on 127.0.0.1, for end-to-end tests and for people.

It starts, in order: etcd, kube-apiserver (real TLS, client certificates and service-account keys
made at start-up with openssl), kube-controller-manager (so Jobs create pods),
kube-scheduler (profiles ``default-scheduler`` and ``ack-co-scheduler``, wired to the gpushare
extender by the same ``KubeSchedulerConfiguration`` that ``gpushare scheduler-config`` prints),
the gpushare extender, and kwok for nodes without kubelets. Every process is stopped by PID; a
component that fails to start has its log tail printed. ``clusterctl.py`` is the command that
starts one for a person (``make cluster``).

The binaries come from ``harness/controlplane/build.sh`` (built once, cached by version).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpushare.kube.sealing import new_key_text
from gpushare.schedconfig import scheduler_configuration
from harness.ports import free_port
from harness.seeding import (
    KWOK_ANNOTATION,
    KWOK_VALUE,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BUILD = HERE / "controlplane" / "build.sh"
STAGES = HERE / "controlplane" / "kwok-stages.yaml"
RUNNING_STAGE = "gpushare-pod-running"
KWOK_SELECTOR = f"{KWOK_ANNOTATION}={KWOK_VALUE}"


class StartError(RuntimeError):
    """A component did not come up; the message carries its log tail."""


K8S_VERSION_ENV = "GPUSHARE_E2E_K8S_VERSION"
"""Names the Kubernetes release the control plane and the real node's kubelet run (build.sh's
``K8S_VERSION``, e.g. ``v1.30.14`` for the oldest supported minor; unset: build.sh's default,
the newest tested). Only releases build.sh has a pinned module for build."""


def build_env() -> dict[str, str]:
    """build.sh's environment: this one, with the release named by ``GPUSHARE_E2E_K8S_VERSION``.

    Only that variable selects the release, so a ``K8S_VERSION`` left in a shell for some other
    tool does not quietly change what the tests run on."""
    env = {k: v for k, v in os.environ.items() if k != "K8S_VERSION"}
    version = os.environ.get(K8S_VERSION_ENV, "").strip()
    if version:
        env["K8S_VERSION"] = version
    return env


def build_binaries() -> dict[str, Path]:
    """Run build.sh (a no-op when cached) and map each binary name to its path."""
    result = subprocess.run(
        ["bash", str(BUILD)], check=True, stdout=subprocess.PIPE, text=True, env=build_env()
    )
    found: dict[str, Path] = {}
    for line in result.stdout.split():
        for binary in Path(line).iterdir():
            found[binary.name] = binary
    return found


GATEWAY = "10.88.77.1"
"""This machine's address on a real node's pod bridge (``gateway`` nodes; host-local gives the
bridge the first address of ``realnode.SUBNET``). The API server's certificate names it, so a
pod on the pod network can reach the API server through a relay there."""


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(pki: Path) -> None:
    """CA, serving and client certificates, front-proxy pair and service-account keys."""
    pki.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "front-proxy-ca"):
        _openssl(
            "req",
            "-x509",
            *ec,
            "-keyout",
            f"{ca}.key",
            "-out",
            f"{ca}.crt",
            "-days",
            "3650",
            "-subj",
            f"/CN=gpushare-e2e-{ca}",
            cwd=pki,
        )
    leaves = [
        (
            "apiserver",
            "ca",
            "/CN=kube-apiserver",
            "serverAuth",
            "IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
            # GATEWAY: pods of the real node reach the API server through a relay there
            f"DNS:kubernetes.default.svc,IP:10.0.0.1,IP:{GATEWAY}",
        ),
        ("admin", "ca", "/O=system:masters/CN=kubernetes-admin", "clientAuth", ""),
        ("scheduler", "ca", "/CN=system:kube-scheduler", "clientAuth", ""),
        ("controller-manager", "ca", "/CN=system:kube-controller-manager", "clientAuth", ""),
        ("front-proxy-client", "front-proxy-ca", "/CN=front-proxy-client", "clientAuth", ""),
    ]
    for name, ca, subject, usage, sans in leaves:
        _openssl(
            "req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=pki
        )
        ext = pki / f"{name}.ext"
        ext.write_text(
            f"extendedKeyUsage={usage}\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            + (f"subjectAltName={sans}\n" if sans else "")
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            f"{ca}.crt",
            "-CAkey",
            f"{ca}.key",
            "-CAcreateserial",
            "-out",
            f"{name}.crt",
            "-days",
            "365",
            "-extfile",
            ext.name,
            cwd=pki,
        )
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def write_kubeconfig(path: Path, server: str, pki: Path, user: str) -> None:
    """A kubeconfig that authenticates with a client certificate."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "gpushare-e2e",
                "cluster": {"server": server, "certificate-authority": str(pki / "ca.crt")},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(pki / f"{user}.crt"),
                    "client-key": str(pki / f"{user}.key"),
                },
            }
        ],
        "contexts": [
            {"name": "gpushare-e2e", "context": {"cluster": "gpushare-e2e", "user": user}}
        ],
        "current-context": "gpushare-e2e",
    }
    path.write_text(yaml.safe_dump(config))


@dataclass
class Process:
    """One started component."""

    name: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str] | None = None) -> None:
        handle = self.log.open("ab")
        self.popen = subprocess.Popen(
            self.argv,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
        handle.close()

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        if not self.log.exists():
            return "(no log)"
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, grace: float = 5.0) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        stop_pid(self.popen.pid, grace)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=1)


def stop_pid(pid: int, grace: float = 5.0) -> None:
    """SIGTERM the process group, then SIGKILL after ``grace`` seconds."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        # a child of ours stays a zombie until reaped; reap it if it is ours
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def wait_for(
    what: str, check: Callable[[], bool], timeout: float, process: Process | None = None
) -> None:
    """Poll ``check`` until true; fail with the component's log tail."""
    deadline = time.monotonic() + timeout
    last_error = ""
    while time.monotonic() < deadline:
        if process is not None and not process.alive():
            raise StartError(f"{process.name} exited while waiting for {what}:\n{process.tail()}")
        try:
            if check():
                return
        except Exception as err:
            last_error = f"{type(err).__name__}: {err}"
        time.sleep(0.3)
    tail = f"\n--- {process.name} log ---\n{process.tail()}" if process else ""
    raise StartError(f"timed out after {timeout:.0f}s waiting for {what} ({last_error}){tail}")


@dataclass
class Cluster:
    """The running control plane and the paths a test needs."""

    root: Path
    binaries: dict[str, Path]
    processes: dict[str, Process] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    extender_unit: str = "1GiB"
    extender_policy: str | None = None
    extender_identity: str = "chart"
    """``chart``: the extender runs with a token of the chart's scheduler ServiceAccount, bound
    by the chart's RBAC (harness.identities); ``admin``: with the admin kubeconfig."""
    """``gpushare extender --policy``; None: the extender's default."""
    extender_extra: tuple[str, ...] = ()
    """Flags the extender is started with besides the harness's own (``start_extender``)."""
    apiserver_extra: tuple[str, ...] = ()
    """Flags kube-apiserver starts with besides the harness's own: a platform's admission
    configuration (``harness/platforms.py``), applied with :meth:`restart_apiserver`."""
    pods_run: bool = True
    """kwok's stage that turns bound pods Running. The replay benchmark turns it off: nothing
    it measures reads a pod's phase (a bound pod holds its share from its ``nodeName`` on), and
    the status write per pod, fanned out to every watcher, was a large share of its CPU."""
    node_lease_s: int = 40
    """kwok's node lease duration; it renews every quarter of it, so 1,213 replay nodes at 40 s
    write 121 leases a second, ten times the pods. kube-controller-manager's grace period (after
    which it taints a node unreachable) is this plus 10 s."""
    scheduler_gates: dict[str, bool] = field(default_factory=dict)
    """kube-scheduler ``--feature-gates`` (the replay benchmark turns SchedulerPopFromBackoffQ
    off, so a pod found unschedulable is not tried again while its backoff lasts)."""
    scheduler_settings: dict[str, Any] = field(default_factory=dict)
    """Top-level KubeSchedulerConfiguration fields laid over ``scheduler_configuration``'s
    (the replay benchmark's long pod backoff); the profiles stay the ones it makes."""

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "admin.kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def extender_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['extender']}"

    @property
    def seal_key(self) -> Path:
        """The seal key the extender and the real node's device plugin share (``start`` makes
        it; a restarted extender keeps it, so the allocations it sealed still count)."""
        return self.root / "seal.key"

    def env(self) -> dict[str, str]:
        """Environment for kubectl and kubectl-inspect-cgpu against this cluster."""
        path = os.pathsep.join(
            [
                str(self.binaries["kubectl"].parent),
                str(Path(sys.executable).parent),
                os.environ.get("PATH", ""),
            ]
        )
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PATH": path}

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against the cluster."""
        result = subprocess.run(
            [str(self.binaries["kubectl"]), *args],
            env=self.env(),
            capture_output=True,
            text=True,
            input=input,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
        return result

    def create_namespace(self, name: str, *, check: bool = True) -> bool:
        """Create a namespace and wait for its ``default`` ServiceAccount.

        kube-apiserver's ServiceAccount admission refuses every pod of a namespace until
        kube-controller-manager's serviceaccount controller has made ``default`` there (a
        race a busy machine loses: "serviceaccount \"default\" not found"). Returns whether
        the namespace was created; with ``check=False`` an existing one is not an error.
        """
        made = self.kubectl("create", "namespace", name, check=check).returncode == 0
        wait_for(
            f"the default ServiceAccount of namespace {name}",
            lambda: (
                self.kubectl("-n", name, "get", "serviceaccount", "default", check=False).returncode
                == 0
            ),
            60,
            self.processes.get("kube-controller-manager"),
        )
        return made

    def kubectl_json(self, *args: str) -> Any:
        """kubectl ... -o json, parsed."""
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def _https_ok(self, url: str, *, client: bool) -> bool:
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        if client:
            context.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        else:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        with urllib.request.urlopen(url, context=context, timeout=2) as response:
            return bool(response.status == 200)

    @staticmethod
    def _http_ok(url: str) -> bool:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)

    def _spawn(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> Process:
        process = Process(name, list(argv), self.root / "logs" / f"{name}.log")
        process.start(env)
        self.processes[name] = process
        (self.root / "pids").write_text(
            "".join(f"{p.name} {p.pid}\n" for p in self.processes.values())
        )
        return process

    # -- components -------------------------------------------------------------------------

    def start(self, progress: Callable[[str], None] = lambda _: None) -> None:
        """Start everything and wait until pods can be created and scheduled."""
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        progress("certificates")
        make_pki(self.pki)
        self.seal_key.write_text(new_key_text() + "\n")
        self.seal_key.chmod(0o600)
        for name in (
            "etcd",
            "etcd-peer",
            "apiserver",
            "controller-manager",
            "scheduler",
            "extender",
            "kwok",
        ):
            self.ports[name] = free_port()
        for user in ("admin", "scheduler", "controller-manager"):
            write_kubeconfig(self.root / f"{user}.kubeconfig", self.server, self.pki, user)
        try:
            self._start_etcd(progress)
            self._start_apiserver(progress)
            self._start_controller_manager(progress)
            self.start_extender(progress)
            self._start_scheduler(progress)
            self._start_kwok(progress)
            progress("default service account")
            wait_for(
                "the default ServiceAccount",
                lambda: (
                    self.kubectl("get", "serviceaccount", "default", check=False).returncode == 0
                ),
                60,
                self.processes["kube-controller-manager"],
            )
        except BaseException:
            self.stop()
            raise

    def _start_etcd(self, progress: Callable[[str], None]) -> None:
        progress("etcd")
        port = self.ports["etcd"]
        process = self._spawn(
            "etcd",
            [
                str(self.binaries["etcd"]),
                "--name",
                "e2e",
                "--data-dir",
                str(self.root / "etcd"),
                "--listen-client-urls",
                f"http://127.0.0.1:{port}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{port}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{self.ports['etcd-peer']}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{self.ports['etcd-peer']}",
                "--initial-cluster",
                f"e2e=http://127.0.0.1:{self.ports['etcd-peer']}",
                "--quota-backend-bytes",
                str(4 * 1024**3),
                "--log-level",
                "warn",
                "--unsafe-no-fsync",
            ],
        )
        wait_for(
            "etcd /health", lambda: self._http_ok(f"http://127.0.0.1:{port}/health"), 30, process
        )

    def _start_apiserver(self, progress: Callable[[str], None]) -> None:
        progress("kube-apiserver")
        pki = self.pki
        process = self._spawn(
            "kube-apiserver",
            [
                str(self.binaries["kube-apiserver"]),
                f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
                f"--secure-port={self.ports['apiserver']}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                "--authorization-mode=Node,RBAC",
                # As kubeadm and managed clusters do: the chart's device plugin is privileged.
                "--allow-privileged=true",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--endpoint-reconciler-type=none",
                f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
                f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
                f"--cert-dir={self.root / 'apiserver-certs'}",
                "--profiling=false",
                "--max-requests-inflight=1000",
                "--max-mutating-requests-inflight=500",
                # the real node's kubelet trusts the cluster CA; logs and exec dial its InternalIP
                f"--kubelet-client-certificate={pki / 'admin.crt'}",
                f"--kubelet-client-key={pki / 'admin.key'}",
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                # No kube-proxy: webhooks behind a Service (the chart's) are called at the
                # Service's endpoint IPs rather than its ClusterIP.
                "--enable-aggregator-routing=true",
                *self.apiserver_extra,
            ],
        )
        wait_for(
            "kube-apiserver /readyz",
            lambda: self._https_ok(f"{self.server}/readyz", client=True),
            120,
            process,
        )

    def _start_controller_manager(self, progress: Callable[[str], None]) -> None:
        progress("kube-controller-manager")
        kubeconfig = self.root / "controller-manager.kubeconfig"
        port = self.ports["controller-manager"]
        process = self._spawn(
            "kube-controller-manager",
            [
                str(self.binaries["kube-controller-manager"]),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--secure-port={port}",
                "--bind-address=127.0.0.1",
                f"--service-account-private-key-file={self.pki / 'sa.key'}",
                f"--root-ca-file={self.pki / 'ca.crt'}",
                "--use-service-account-credentials=true",
                "--leader-elect=false",
                f"--cert-dir={self.root / 'cm-certs'}",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                f"--node-monitor-grace-period={self.node_lease_s + 10}s",
            ],
        )
        wait_for(
            "kube-controller-manager /healthz",
            lambda: self._https_ok(f"https://127.0.0.1:{port}/healthz", client=False),
            60,
            process,
        )

    def start_extender(
        self,
        progress: Callable[[str], None] = lambda _: None,
        *,
        unit: str | None = None,
        policy: str | None = None,
        command: Sequence[str] = (),
        wrapper: Sequence[str] = (),
        ready_timeout: float = 60,
        extra: Sequence[str] | None = None,
    ) -> None:
        """Start (or restart) the gpushare extender on its fixed port, counting ``unit`` and
        scoring nodes with ``policy``, with ``extra`` flags (each kept for later restarts;
        ``extra=()`` drops the kept ones).

        ``command`` serves another program there instead (a benchmark's reference extender),
        given the kubeconfig and the port as ``--kubeconfig K --port P``; ``wrapper`` runs
        gpushare's own command line under another program (a benchmark's profiler).
        ``ready_timeout`` is how long its first list of the cluster may take."""
        progress("gpushare extender")
        if unit is not None:
            self.extender_unit = unit
        if policy is not None:
            self.extender_policy = policy
        if extra is not None:
            self.extender_extra = tuple(extra)
        old = self.processes.get("gpushare-extender")
        if old is not None:
            old.stop()
        gpushare = Path(sys.executable).parent / "gpushare"
        kubeconfig = self.kubeconfig
        if self.extender_identity == "chart" and not command:
            from harness.identities import extender_kubeconfig

            kubeconfig = extender_kubeconfig(self)
        where = ["--kubeconfig", str(kubeconfig), "--port", str(self.ports["extender"])]
        own = [
            str(gpushare),
            "extender",
            *where,
            "--gpu-memory-unit",
            self.extender_unit,
            "--seal-key-file",
            str(self.seal_key),
            "--log-level",
            "warning",
            *(["--policy", self.extender_policy] if self.extender_policy else []),
            *self.extender_extra,
        ]
        process = self._spawn(
            "gpushare-extender", [*command, *where] if command else [*wrapper, *own]
        )
        wait_for(
            "gpushare extender /readyz",
            lambda: self._http_ok(f"{self.extender_url}/readyz"),
            ready_timeout,
            process,
        )

    def kill_extender(self) -> None:
        """SIGKILL the extender, as a crash would."""
        process = self.processes["gpushare-extender"]
        if process.alive():
            os.killpg(process.pid, signal.SIGKILL)
            assert process.popen is not None
            process.popen.wait(timeout=10)

    def _start_scheduler(self, progress: Callable[[str], None]) -> None:
        progress("kube-scheduler")
        config = scheduler_configuration(
            url=self.extender_url,
            kubeconfig=str(self.root / "scheduler.kubeconfig"),
            leader_elect=False,
        )
        config["clientConnection"].update(qps=200, burst=400)
        config.update(self.scheduler_settings)
        path = self.root / "scheduler-config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        port = self.ports["scheduler"]
        kubeconfig = self.root / "scheduler.kubeconfig"
        gates = ",".join(f"{k}={str(v).lower()}" for k, v in self.scheduler_gates.items())
        process = self._spawn(
            "kube-scheduler",
            [
                str(self.binaries["kube-scheduler"]),
                f"--config={path}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--secure-port={port}",
                "--bind-address=127.0.0.1",
                f"--cert-dir={self.root / 'scheduler-certs'}",
                *([f"--feature-gates={gates}"] if gates else []),
            ],
        )
        wait_for(
            "kube-scheduler /healthz",
            lambda: self._https_ok(f"https://127.0.0.1:{port}/healthz", client=False),
            60,
            process,
        )

    def restart_apiserver(self, down_s: float = 0.0) -> None:
        """Stop kube-apiserver, wait ``down_s``, and start it again on the same port; its state
        is in etcd. Every watch open on it ends, and its watch cache starts over."""
        old = self.processes.get("kube-apiserver")
        if old is not None:
            old.stop()
        time.sleep(down_s)
        self._start_apiserver(lambda _: None)

    def restart_scheduler(self) -> None:
        """Stop kube-scheduler and start it again (reading ``scheduler_settings`` anew)."""
        self.stop_scheduler()
        self.start_scheduler()

    def stop_scheduler(self) -> None:
        """Stop kube-scheduler (pods created meanwhile wait unscheduled)."""
        old = self.processes.get("kube-scheduler")
        if old is not None:
            old.stop()

    def start_scheduler(self) -> None:
        """Start kube-scheduler and wait until it answers /healthz."""
        self._start_scheduler(lambda _: None)

    def _start_kwok(self, progress: Callable[[str], None]) -> None:
        progress("kwok")
        port = self.ports["kwok"]
        process = self._spawn(
            "kwok",
            [
                str(self.binaries["kwok"]),
                f"--kubeconfig={self.kubeconfig}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_SELECTOR}",
                f"--node-lease-duration-seconds={self.node_lease_s}",
                f"--server-address=127.0.0.1:{port}",
                "--cidr=10.244.0.0/16",
                "--node-ip=10.2.0.1",
                "-c",
                str(self._stages()),
            ],
        )
        wait_for(
            "kwok /healthz", lambda: self._http_ok(f"http://127.0.0.1:{port}/healthz"), 60, process
        )

    def _stages(self) -> Path:
        """kwok's stage file: ``STAGES``, without the running stage unless ``pods_run``."""
        if self.pods_run:
            return STAGES
        kept = [
            doc
            for doc in yaml.safe_load_all(STAGES.read_text())
            if doc and doc["metadata"]["name"] != RUNNING_STAGE
        ]
        path = self.root / "kwok-stages.yaml"
        path.write_text(yaml.safe_dump_all(kept))
        return path

    def create_nodes(self, nodes: list[dict[str, Any]], timeout: float = 120) -> None:
        """kubectl apply the nodes and wait until kwok reports them Ready.

        Sent as JSON: PyYAML writes a string such as ``123e45`` (a random hex suffix) unquoted,
        and kubectl's YAML reader takes it for a number, refusing it as a label value.
        """
        body = json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes})
        self.kubectl("apply", "-f", "-", input=body, timeout=300)
        names = {n["metadata"]["name"] for n in nodes}

        def ready() -> bool:
            items = self.kubectl_json("get", "nodes")["items"]
            done = {
                n["metadata"]["name"]
                for n in items
                if any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in n.get("status", {}).get("conditions", [])
                )
            }
            return names <= done

        wait_for(f"{len(names)} node(s) Ready", ready, timeout, self.processes.get("kwok"))

    def stop(self) -> None:
        """Stop everything this cluster started, newest first, by PID."""
        for process in reversed(list(self.processes.values())):
            process.stop()
        self.processes.clear()


@contextlib.contextmanager
def running_cluster(
    root: Path,
    progress: Callable[[str], None] = lambda _: None,
    *,
    policy: str | None = None,
    scheduler_settings: dict[str, Any] | None = None,
    scheduler_gates: dict[str, bool] | None = None,
    pods_run: bool = True,
    node_lease_s: int = 40,
) -> Iterator[Cluster]:
    """Build (cached), start, yield, stop."""
    cluster = Cluster(
        root=root,
        binaries=build_binaries(),
        extender_policy=policy,
        scheduler_settings=dict(scheduler_settings or {}),
        scheduler_gates=dict(scheduler_gates or {}),
        pods_run=pods_run,
        node_lease_s=node_lease_s,
    )
    with _stopped_by_sigterm():
        cluster.start(progress)
        try:
            yield cluster
        finally:
            cluster.stop()


@contextlib.contextmanager
def _stopped_by_sigterm() -> Iterator[None]:
    """Turn SIGTERM into ``SystemExit`` while a cluster runs, so ``kill <pid>`` of a benchmark
    stops the control plane it started: Python's own SIGTERM ends the process without running
    ``finally``, leaving etcd, kube-apiserver, the extender and kwok behind. Only from the main
    thread and only where nothing else handles SIGTERM."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def leave(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, leave)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
