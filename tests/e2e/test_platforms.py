"""The chart on each managed platform's GPU node, reproduced on the real node.

One real node (containerd 2, kubelet, this machine's kernel) is shaped like a platform's GPU
node by ``harness/platforms.py`` and the chart is installed on it as users install it, with
``helm install --set platform=<p>`` and the values this test machine needs (local images, the
node's kubelet paths, the API server's loopback address). Then, per platform:

- ``test_platform[<p>]``: the components come up, the walkthrough's GPUtest runs, the
  cuda-sample is steered and runs with the interposer mapped, ``helm test`` passes, and the
  release uninstalls; the shape is undone after.
- ``test_before[<case>]``: the same shape with the chart's defaults (no preset) fails, and the
  test asserts the words users see (kubelet's events, the DaemonSet controller's, the plugin's
  log, the tenant's loader). These pass today: they are the "before" of issue 59.
- ``test_other_plugin_refusal[<p>]``: beside the platform's managed plugin (a second plugin
  offering ``nvidia.com/gpu``, registered with the real kubelet) the device plugin refuses, naming
  that platform's own switch.

What each platform's shape is here, and what cannot be reproduced on this machine (and is
therefore the vendor's word, [Sn] of ``shared/docs/PLATFORMS.md``):

============  ==============================================  =====================================
platform      reproduced here                                 not reproducible here (why)
============  ==============================================  =====================================
gke           no NVIDIA runtime, driver root holding the      COS's osImage/providerID (kubelet
              fake NVML at /home/kubernetes/bin/nvidia,       reports this machine's); webhook
              read-only /usr/local, noexec /var and /home,    port 9443 on private clusters (no
              taint nvidia.com/gpu=present, GKE labels,       firewall between API server and
              critical-priority quota admission, 2nd plugin   node on one machine) [S3][S7]
eks           CDI via containerd 2 (nodeadm's enable_cdi),    the NVIDIA runtime as default
              2nd plugin (eksctl's), EKS labels               (none here); custom CNI [S13][S7]
bottlerocket  read-only /usr/local, the toolkit granting      SELinux (this kernel runs none);
              nothing for the variable (no NVIDIA runtime),   the toolkit's and host plugin's
              CDI via containerd 2, 2nd plugin                settings (Bottlerocket's API);
                                                              osImage, so the refusal's switch
                                                              [S9][S10][S11][S12]
aks           CDI via containerd 2, 2nd plugin, AKS labels    the GPU image's toolkit [S15]
openshift     Pod Security restricted on the namespace,       SCC admission's refusals
              RuntimeClass nvidia (not the default),          (OpenShift's API server: the SCC
              restricted-v2's ids from the namespace's        rules are checked as data by the
              range (a MutatingAdmissionPolicy)               chart's tests), SELinux, CRI-O
                                                              [S19]
k3s           /run/k3s/containerd socket, RuntimeClass        k3s's embedded containerd itself
              nvidia not default, kubelet root moved          [S16][S17]
              (pod-resources moves, device-plugins stays)
rke2          as k3s, plus Pod Security restricted            the CIS profile's other settings
                                                              [S18]
kubeadm       the documented path (GPU Operator's CDI),       the GPU Operator itself
              2nd plugin (the operator's)
============  ==============================================  =====================================

The "nvidia" runtime handler here is runc under that name: RuntimeClass ``nvidia`` selects it, but
it mounts nothing, so where a platform's preset relies on the NVIDIA runtime for NVML the plugin
runs with ``testing.fakeGpus`` (GKE's driver root apart: there NVML is really loaded, from the
fake driver). Run one platform alone with ``-k gke`` (``-k "before and quota"`` for one case).

``helm test`` runs without the webhook's own test pod: it calls the webhook's Service by DNS
name, and this control plane has no cluster DNS.

Where the fix changed what users see (the Pod Security refusal at install, the hand-off proof,
the plugin's lib-dir check), the before tests assert the fixed words; the words users saw
before are recorded in docs/platforms-matrix.md.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.cluster import Cluster
from harness.platforms import (
    GKE_TAINT,
    PLATFORMS,
    SCC_RANGE_START,
    DriverRoot,
    OtherPlugin,
    Platform,
    PlatformNode,
    critical_quota,
    driver_root,
    node_look,
    noexec,
    pod_security,
    priority_quota,
    read_only,
    runtime_class,
    scc_defaults,
)
from harness.realnode import TOLERATION, RealNode, probe_env
from tests.support.e2e import CHART, eventually, helm
from tests.support.realchart import (
    REAL_NAMESPACE,
    REAL_RELEASE,
    WEBHOOK_LABEL,
    allocatable,
    chart_node,
    component_pods,
    helm_test_gpu_pod,
    real_values,
    restart_device_plugin,
    steered_job,
    wait_components,
    why_not,
)
from tests.support.realnode import NS as REAL_NS
from tests.support.realnode import PROBE_THEN, gpu_uuids, local_job, ns_pods

DRIVER_ROOT = Path("/home/kubernetes/bin/nvidia")
"""GKE's driver root [S1]: the gke preset's ``devicePlugin.driverRoot.hostPath``."""
GKE_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def platform_node(cluster: Cluster) -> Iterator[tuple[RealNode, dict[str, str]]]:
    """The real node with k3s's containerd socket and an ``nvidia`` runtime handler (harmless
    to the other platforms: nothing else reads either), in ``share`` mode (GPUtest's)."""

    def make(root: Path) -> RealNode:
        return PlatformNode(cluster=cluster, root=root, plugin=False, gateway=True)

    cluster.kubectl("apply", "-f", "-", input=json.dumps(runtime_class()))
    try:
        yield from chart_node(cluster, make)
    finally:
        cluster.kubectl("delete", "runtimeclass", runtime_class()["metadata"]["name"], check=False)


# -- installing ---------------------------------------------------------------------------------


def _fresh_namespaces(cluster: Cluster) -> None:
    for namespace in (REAL_NAMESPACE, REAL_NS):
        cluster.kubectl(
            "delete", "namespace", namespace, "--ignore-not-found", "--wait=true", timeout=240
        )
        cluster.create_namespace(namespace)
    cluster.kubectl("label", "namespace", REAL_NS, f"{WEBHOOK_LABEL}={REAL_NS}")


def _install(cluster: Cluster, values: dict[str, Any], tmp: Path, *sets: str) -> Any:
    path = tmp / f"values-{time.monotonic_ns()}.yaml"
    path.write_text(yaml.safe_dump(values))
    return helm(
        cluster, "install", REAL_RELEASE, str(CHART), "-n", REAL_NAMESPACE,
        "-f", str(path), "--wait=false", *sets, check=False,
    )  # fmt: skip


def _uninstall(cluster: Cluster) -> None:
    helm(cluster, "uninstall", REAL_RELEASE, "-n", REAL_NAMESPACE, "--wait", check=False)
    cluster.kubectl("delete", "namespace", REAL_NS, "--wait=false", check=False)


@contextlib.contextmanager
def _installed(cluster: Cluster, values: dict[str, Any], tmp: Path, *sets: str) -> Iterator[None]:
    """The chart installed (``helm install`` must succeed), uninstalled after."""
    done = _install(cluster, values, tmp, *sets)
    assert done.returncode == 0, f"helm install {' '.join(sets)}:\n{done.stdout}{done.stderr}"
    try:
        yield
    except BaseException:
        print(why_not(cluster), flush=True)
        raise
    finally:
        _uninstall(cluster)


def _events(cluster: Cluster, namespace: str = REAL_NAMESPACE) -> str:
    """Every event's reason and message in ``namespace``, one a line."""
    items = cluster.kubectl_json("get", "events", "-n", namespace)["items"]
    return "\n".join(
        f"{e['involvedObject'].get('kind')}/{e['involvedObject'].get('name')} "
        f"{e.get('reason')}: {e.get('message', '')}"
        for e in items
    )


def _plugin_log(cluster: Cluster) -> str:
    """The device plugin's log, this start's and the last one's (it may be crash-looping)."""
    out = []
    for previous in ("--previous", ""):
        got = cluster.kubectl(
            "logs", "-n", REAL_NAMESPACE, "-l", "app.kubernetes.io/component=device-plugin",
            "--tail=60", *([previous] if previous else []), check=False,
        )  # fmt: skip
        out.append(got.stdout)
    return "\n".join(out)


def _line_with(text: str, *words: str) -> str:
    """The first line of ``text`` holding every one of ``words``; '' if none."""
    return next((line for line in text.splitlines() if all(w in line for w in words)), "")


def _seen(read: Any, *words: str, timeout: float = 120, what: str = "") -> str:
    """Poll ``read()`` until a line holds all ``words``; return that line (what users see)."""
    return str(eventually(lambda: _line_with(read(), *words), timeout, what or " + ".join(words)))


# -- values -------------------------------------------------------------------------------------


def _rendered_daemonset(
    cluster: Cluster, values: dict[str, Any], tmp: Path, *sets: str
) -> dict[str, Any]:
    """The device plugin's DaemonSet as ``helm template`` renders it with these values."""
    path = tmp / "rendered-values.yaml"
    path.write_text(yaml.safe_dump(values))
    version = cluster.kubectl_json("version")["serverVersion"]["gitVersion"]
    done = helm(
        cluster, "template", REAL_RELEASE, str(CHART), "-n", REAL_NAMESPACE, "-f", str(path),
        "--kube-version", version, "--show-only", "templates/deviceplugin-daemonset.yaml", *sets,
    )  # fmt: skip
    rendered: dict[str, Any] = yaml.safe_load(done.stdout)
    return rendered


def _host_paths(daemonset: dict[str, Any]) -> dict[str, str]:
    """The DaemonSet's hostPath volumes, by volume name."""
    volumes = daemonset["spec"]["template"]["spec"].get("volumes") or []
    return {v["name"]: v["hostPath"]["path"] for v in volumes if "hostPath" in v}


def _arg(daemonset: dict[str, Any], flag: str) -> str:
    (container,) = [
        c
        for c in daemonset["spec"]["template"]["spec"]["containers"]
        if c["name"] == "device-plugin"
    ]
    found = [a.split("=", 1)[1] for a in container.get("args", []) if a.startswith(f"{flag}=")]
    return found[-1] if found else ""


def _defaults(cluster: Cluster, node: RealNode, images: dict[str, str]) -> dict[str, Any]:
    """The chart's defaults, with only what this machine needs (``real_values``)."""
    values = real_values(cluster, node, images)
    _tolerate_gke_taint(values)
    return values


def _tolerate_gke_taint(values: dict[str, Any]) -> None:
    """The scheduler and webhook run on the GPU node here (a single node): on a platform they
    would run elsewhere, so they tolerate the GPU nodes' taint as a test-only value. The
    plugin tolerates it by default, which the machine's tolerations replaced."""
    for component in ("scheduler", "webhook"):
        values[component]["tolerations"] = [TOLERATION, GKE_TOLERATION]
    # the machine's values replace the plugin's default tolerations, which hold GKE's taint
    values["devicePlugin"]["tolerations"].append(GKE_TOLERATION)


PRESET_KEYS = {
    "isolation": ("libHostPath",),
    "devicePlugin": ("stateHostPath", "deviceListStrategy", "cdi"),
}
"""What a preset decides, taken out of the machine's values so the preset's value is the one
used (a value set explicitly would win over it)."""


def _preset_values(
    cluster: Cluster,
    node: RealNode,
    images: dict[str, str],
    platform: Platform,
    driver: DriverRoot | None,
) -> dict[str, Any]:
    """The machine's values with the preset's keys left to the preset, plus this node's facts
    a user of that platform would not need to set (where its CDI specs and device nodes are)."""
    values = _defaults(cluster, node, images)
    for section, keys in PRESET_KEYS.items():
        for key in keys:
            values[section].pop(key, None)
    plugin = values["devicePlugin"]
    if driver is not None:
        # GKE's device nodes are in /dev; this machine's stand-ins are in the driver root's dev/
        plugin["driverRoot"] = {"devHostPath": str(driver.dev)}
        # NVML from the driver root, not made-up GPUs
        values["testing"]["fakeGpus"] = ""
    else:
        # containerd 2 here reads CDI specs only from the node's own directory
        plugin["cdi"] = {"specDirs": [str(node.cdi_dir)]}
    if platform.name in ("k3s", "rke2"):
        # the preset's /run/k3s/containerd/containerd.sock, where this node's containerd listens
        plugin.pop("criSocketPath", None)
    # helm test's GPU pod, on the real node: its taint tolerated, and GKE's
    values["tests"]["gpuPod"]["tolerations"] = [TOLERATION, GKE_TOLERATION]
    return values


# -- the shape ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _shape(cluster: Cluster, node: RealNode, platform: Platform) -> Iterator[DriverRoot | None]:
    """Lay ``platform``'s node over the real node (labels, taints, driver root, quota
    admission, the release namespace's Pod Security level, OpenShift's ids); undo after."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            node_look(cluster, node.name, labels=platform.labels, taints=list(platform.taints))
        )
        driver = stack.enter_context(driver_root(DRIVER_ROOT)) if platform.driver_root else None
        if platform.priority_quota:
            stack.enter_context(priority_quota(cluster))
        if platform.namespace_psa:
            stack.enter_context(pod_security(cluster, REAL_NAMESPACE, platform.namespace_psa))
        if platform.scc_defaults:
            stack.enter_context(scc_defaults(cluster, REAL_NAMESPACE))
        yield driver


@contextlib.contextmanager
def _file_system_rules(platform: Platform, paths: dict[str, str]) -> Iterator[list[str]]:
    """The platform's file-system rules laid over the host paths the chart chose: a read-only
    or noexec mount over each directory that would be so there. Returns the problems found.
    The chart's state and lib directories on this machine (kubelet creates them) are removed
    after, where they did not exist before."""
    problems = []
    with contextlib.ExitStack() as stack:
        for name, path in paths.items():
            if name in ("isolation-lib", "state"):
                stack.enter_context(_removed_after(Path(path)))
            if name == "isolation-lib":
                problem = platform.lib_dir_problem(path)
            elif name == "state":
                problem = platform.state_dir_problem(path)
            else:
                continue
            if problem:
                problems.append(f"{name}: {problem}")
                mount = read_only if "read-only" in problem else noexec
                stack.enter_context(mount(Path(path)))
        yield problems


@contextlib.contextmanager
def _removed_after(path: Path) -> Iterator[None]:
    """Remove ``path`` and the parents made for it afterwards, unless it existed before."""
    made = next((p for p in reversed([path, *path.parents]) if not p.exists()), None)
    try:
        yield
    finally:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)


# -- the walkthrough on the installed chart ------------------------------------------------------


@contextlib.contextmanager
def _core_mem(cluster: Cluster, node: RealNode) -> Iterator[None]:
    """The node in ``core_mem`` mode (the cuda-sample asks for computing power; memory-only
    pods such as GPUtest go to ``share`` nodes only), its plugin restarted; ``share`` after."""
    label = "ack.node.gpu.schedule"
    cluster.kubectl("label", "node", node.name, f"{label}=core_mem", "--overwrite")
    try:
        restart_device_plugin(cluster)
        eventually(
            lambda: int(allocatable(node).get("aliyun.com/gpu-core.percentage", "0")) > 0,
            90,
            "gpu-core.percentage",
        )
        yield
    finally:
        cluster.kubectl("label", "node", node.name, f"{label}=share", "--overwrite")


def _hand_off(
    env: dict[str, str], item: dict[str, Any], strategy: str, uuids: dict[int, str]
) -> None:
    """What the container must have seen of its GPUs, for the plugin's strategy."""
    record = json.loads(item["metadata"]["annotations"]["gpushare.io/allocation"])
    placed = sorted({g["index"] for c in record["containers"] for g in c["gpus"] if g["mem"]})
    devices = ",".join(f"/dev/nvidia{i}" for i in placed)
    if strategy == "envvar":
        # the variable alone: only an NVIDIA runtime turns it into device nodes
        assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids[i] for i in placed), env
    else:
        # cdi-cri (containerd applies the spec) or driver-root (the plugin's device specs)
        assert env.get("PROBE_DEVICES") == devices, (strategy, env)


def _walkthrough(cluster: Cluster, node: RealNode, strategy: str) -> None:
    """GPUtest (placed by the chart's scheduler, served by its plugin) and the cuda-sample
    (steered by its webhook; core_mem, the interposer mapped)."""
    eventually(lambda: int(allocatable(node).get("aliyun.com/gpu-mem", "0")) > 0, 120, "gpu-mem")
    uuids = gpu_uuids(cluster, node.name)
    item, env = _run_job(cluster, "GPUtest", "GPUtest Succeeded")
    assert env["ALIYUN_COM_GPU_MEM_CONTAINER"] == "3", env
    _hand_off(env, item, strategy, uuids)
    with _core_mem(cluster, node):
        env = steered_job(cluster, "cuda-sample")
    assert env["ALIYUN_COM_GPU_MEM_CONTAINER"] == "2", env
    assert env["GPUSHARE_CORE_LIMIT"] == "30", env
    assert "libgpushare-cuda.so" in env["PROBE_MAPPED"], env


def _helm_test(cluster: Cluster) -> str:
    """``helm test`` but the webhook's own test pod: must pass, and run a pod that asks
    for a GPU unit. The webhook's test calls its Service by DNS name, and this control plane
    runs no cluster DNS (nor kube-proxy), so it cannot pass here whatever the platform."""
    done = helm(
        cluster, "test", REAL_RELEASE, "-n", REAL_NAMESPACE, "--logs", "--timeout", "150s",
        "--filter", f"!name={REAL_RELEASE}-test", check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"helm test:\n{done.stdout}{done.stderr}\n{why_not(cluster)}"
    return str(done.stdout)


def _test_suites(output: str) -> list[str]:
    """The test pods ``helm test`` ran (its ``TEST SUITE:`` lines)."""
    return [
        line.split(":", 1)[1].strip()
        for line in output.splitlines()
        if line.startswith("TEST SUITE:") and line.split(":", 1)[1].strip() != "None"
    ]


# -- the matrix ---------------------------------------------------------------------------------

MATRIX = [
    "gke",
    "eks",
    "bottlerocket",
    "aks",
    "openshift",
    "k3s",
    "rke2",
    "kubeadm",
]


@pytest.mark.e2e
@pytest.mark.parametrize("name", MATRIX)
def test_platform(
    cluster: Cluster, platform_node: tuple[RealNode, dict[str, str]], tmp_path: Path, name: str
) -> None:
    """Install with the platform's preset on its node shape; walkthrough, cuda-sample, helm
    test; uninstall."""
    node, images = platform_node
    platform = PLATFORMS[name]
    _fresh_namespaces(cluster)
    started = time.monotonic()
    with _shape(cluster, node, platform) as driver:
        values = _preset_values(cluster, node, images, platform, driver)
        sets = () if name == "kubeadm" else ("--set", f"platform={name}")
        if platform.namespace_psa:
            # the install refuses in words while the namespace enforces less than privileged
            refused = _install(cluster, values, tmp_path, *sets)
            assert refused.returncode != 0, refused.stdout
            assert "pod-security.kubernetes.io/enforce" in refused.stderr, refused.stderr
            assert "privileged" in refused.stderr, refused.stderr
            cluster.kubectl(
                "label", "namespace", REAL_NAMESPACE, "--overwrite",
                "pod-security.kubernetes.io/enforce=privileged",
            )  # fmt: skip
        daemonset = _rendered_daemonset(cluster, values, tmp_path, *sets)
        paths = _host_paths(daemonset)
        strategy = _arg(daemonset, "--device-list-strategy")
        if platform.runtime_class:
            spec = daemonset["spec"]["template"]["spec"]
            assert spec.get("runtimeClassName") == platform.runtime_class, spec
        if platform.driver_root:
            assert strategy == "driver-root", strategy
            assert str(DRIVER_ROOT) in paths.values(), paths
        # the platform's read-only and noexec directories over the host paths the preset chose
        with _file_system_rules(platform, paths) as problems:
            assert problems == [], f"the {name} preset's host paths: {problems}"
            with _installed(cluster, values, tmp_path, *sets):
                wait_components(cluster, f"{name}: components Ready", timeout=240)
                installed = time.monotonic() - started
                if driver is not None:
                    # NVML really loaded from the driver root: its GPUs, not made-up ones
                    want = sorted(driver.uuids())
                    assert sorted(gpu_uuids(cluster, node.name).values()) == want
                _walkthrough(cluster, node, strategy)
                tested = _helm_test(cluster)
                suites = _test_suites(tested)
                # a test pod that asks for a GPU unit, besides the webhook's
                gpu_tests = [n for n in suites if n.removeprefix(REAL_RELEASE).find("gpu") >= 0]
                assert gpu_tests, f"no GPU pod in helm test: {suites}\n{tested}"
                assert "hand-off ok" in tested, tested
    print(
        f"[e2e] platform {name}: installed in {installed:.0f}s, "
        f"all in {time.monotonic() - started:.0f}s",
        flush=True,
    )


# -- before: the chart's defaults on each shape ---------------------------------------------------


@pytest.mark.e2e
def test_before_pod_security_baseline(
    cluster: Cluster, platform_node: tuple[RealNode, dict[str, str]], tmp_path: Path
) -> None:
    """C2, R5, O1/O2: the release namespace enforcing ``baseline`` (Rancher's and OpenShift's
    defaults are stricter still). Before: the install succeeds and the DaemonSet controller
    cannot create the plugin's pod. With the chart's Pod Security check (``podSecurity``)
    the install itself refuses, naming the label to set."""
    node, images = platform_node
    _fresh_namespaces(cluster)
    with pod_security(cluster, REAL_NAMESPACE, "baseline"):
        done = _install(cluster, _defaults(cluster, node, images), tmp_path)
        try:
            assert done.returncode != 0, done.stdout
            assert "pod-security.kubernetes.io/enforce" in done.stderr, done.stderr
            print(f"[after] Pod Security baseline: {done.stderr.strip()}", flush=True)
        finally:
            _uninstall(cluster)


@pytest.mark.e2e
def test_before_priority_class_quota(
    cluster: Cluster, platform_node: tuple[RealNode, dict[str, str]], tmp_path: Path
) -> None:
    """G5: GKE's quota admission: no critical-priority pod outside kube-system without a
    ResourceQuota naming its class; the chart's three workloads all use those classes."""
    node, images = platform_node
    _fresh_namespaces(cluster)
    with priority_quota(cluster), _installed(cluster, _defaults(cluster, node, images), tmp_path):
        line = _seen(
            lambda: _events(cluster), "FailedCreate", "insufficient quota to match these scopes"
        )
        print(f"[before] GKE priority-class quota: {line}", flush=True)
        # and a quota naming both classes is what lets them in (what the chart must render)
        cluster.kubectl("apply", "-f", "-", input=json.dumps(critical_quota(REAL_NAMESPACE)))
        eventually(lambda: component_pods(cluster).get("device-plugin"), 120, "plugin pod made")


@pytest.mark.e2e
def test_before_read_only_lib_dir(
    cluster: Cluster, platform_node: tuple[RealNode, dict[str, str]], tmp_path: Path
) -> None:
    """G4, B4: ``isolation.libHostPath`` under a read-only ``/usr/local`` (COS, Bottlerocket):
    kubelet cannot create it, and the plugin's pod never starts. The directory is a stand-in
    for the host's ``/usr/local`` (this machine's stays writable for everyone else)."""
    node, images = platform_node
    _fresh_namespaces(cluster)
    values = _defaults(cluster, node, images)
    usr_local = node.root / "platform" / "usr" / "local"
    values["isolation"]["libHostPath"] = str(usr_local / "gpushare")
    with read_only(usr_local), _installed(cluster, values, tmp_path):
        line = _seen(lambda: _events(cluster), "/usr/local/gpushare: read-only file system")
        print(f"[before] read-only /usr/local: {line}", flush=True)
        assert "FailedMount" in line and "mkdir" in line, line


@pytest.mark.e2e
def test_before_no_nvidia_runtime(
    cluster: Cluster, platform_node: tuple[RealNode, dict[str, str]], tmp_path: Path
) -> None:
    """G2, R2, O3, B2: no NVIDIA runtime applying ``NVIDIA_VISIBLE_DEVICES=all`` to the plugin
    (GKE has none; k3s's and OpenShift's is not the default; Bottlerocket's refuses the
    variable from unprivileged containers), even with the driver on the host: the plugin
    reads no GPU."""
    node, images = platform_node
    _fresh_namespaces(cluster)
    values = _defaults(cluster, node, images)
    values["testing"]["fakeGpus"] = ""  # NVML, as on a real node
    with driver_root(DRIVER_ROOT), _installed(cluster, values, tmp_path):
        line = _seen(lambda: _plugin_log(cluster), "cannot read GPUs through NVML")
        print(f"[before] no NVIDIA runtime: {line}", flush=True)


def _run_job(cluster: Cluster, name: str, what: str) -> tuple[dict[str, Any], dict[str, str]]:
    """Run the seed Job ``examples/<name>.yaml`` with the probe to completion; its pod and
    what the probe printed. The Job is deleted after."""
    job = local_job(f"{name}.yaml", command=["/bin/sh", "-c", PROBE_THEN + "sleep 1"])
    job_name = job["metadata"]["name"]
    cluster.kubectl("apply", "-f", "-", input=json.dumps(job))

    def done() -> list[dict[str, Any]]:
        return [
            p for p in ns_pods(cluster, REAL_NS)
            if p["metadata"].get("labels", {}).get("job-name") == job_name
            and p["status"].get("phase") == "Succeeded"
        ]  # fmt: skip

    try:
        item = eventually(done, 150, what)[0]
    except AssertionError as err:
        raise AssertionError(f"{err}\n{why_not(cluster)}") from None
    logs = cluster.kubectl("logs", "-n", REAL_NS, item["metadata"]["name"]).stdout
    cluster.kubectl("delete", "job", "-n", REAL_NS, job_name, "--wait=true")
    eventually(lambda: not ns_pods(cluster, REAL_NS), 90, f"{job_name} pod gone")
    env = probe_env(logs)
    env["PROBE_LOG"] = logs
    return item, env


@pytest.mark.e2e
def test_before_envvar_without_runtime(
    cluster: Cluster, platform_node: tuple[RealNode, dict[str, str]], tmp_path: Path
) -> None:
    """C5, B2, A3: ``envvar`` where no runtime turns the variable into devices (Bottlerocket's
    toolkit refusing it, an image without the NVIDIA runtime). Before: the GPUtest pod runs and
    succeeds with ``NVIDIA_VISIBLE_DEVICES`` set and no ``/dev/nvidia*``, and nothing notices.
    With the hand-off proof (``devicePlugin.handOffCheck``) the plugin or ``helm test``
    says so instead."""
    node, images = platform_node
    _fresh_namespaces(cluster)
    values = _defaults(cluster, node, images)
    values["devicePlugin"]["deviceListStrategy"] = "envvar"
    values["devicePlugin"].pop("cdi", None)
    with _installed(cluster, values, tmp_path):
        # the plugin's start check says what it found; if it starts, helm test's GPU pod
        # finds no device node and fails in words
        line = _seen(lambda: _plugin_log(cluster), "phase=hand-off-check")
        print(f"[after] envvar without an NVIDIA runtime, the plugin: {line}", flush=True)
        if "refus" in line.lower():
            return
        wait_components(cluster, "components Ready", timeout=240)
        tested = helm_test_gpu_pod(cluster)
        print(f"[after] envvar without an NVIDIA runtime, helm test:\n{tested.stdout}")
        assert tested.returncode != 0, tested.stdout
        assert "FAIL" in tested.stdout, tested.stdout


@pytest.mark.e2e
def test_before_noexec_lib_dir(
    cluster: Cluster, platform_node: tuple[RealNode, dict[str, str]], tmp_path: Path
) -> None:
    """G4: ``isolation.libHostPath`` on a noexec mount (COS's ``/var``). With the start check
    the plugin refuses, naming the path and the mount flag. Before it, the plugin starts
    and serves, and every isolated container fails to start: runc cannot execute the mount
    check hook the plugin put in that directory."""
    node, images = platform_node
    _fresh_namespaces(cluster)
    values = _defaults(cluster, node, images)
    lib = node.root / "platform" / "var" / "lib" / "gpushare-lib"
    values["isolation"]["libHostPath"] = str(lib)
    with noexec(lib), _installed(cluster, values, tmp_path):
        line = _seen(lambda: _plugin_log(cluster), str(lib), "noexec")
        print(f"[after] noexec lib dir: {line}", flush=True)
        assert "isolation.libHostPath" in line, line


@pytest.mark.e2e
def test_before_gpu_taint(
    cluster: Cluster, platform_node: tuple[RealNode, dict[str, str]], tmp_path: Path
) -> None:
    """G6, C3: GKE's ``nvidia.com/gpu=present:NoSchedule`` on the GPU node: with the chart's
    defaults (``webhook.steer.tolerations`` empty, the gke preset sets it) the steered
    cuda-sample stays Pending; ExtendedResourceToleration adds only the requested resource's."""
    node, images = platform_node
    _fresh_namespaces(cluster)
    with _installed(cluster, _defaults(cluster, node, images), tmp_path):
        wait_components(cluster, "components Ready", timeout=240)
        job = local_job("cuda-sample.yaml", command=["/bin/sh", "-c", PROBE_THEN + "sleep 1"])
        # TaintToleration filters before NodeResourcesFit: the node's mode does not matter
        with node_look(cluster, node.name, taints=[GKE_TAINT]):
            cluster.kubectl("apply", "-f", "-", input=json.dumps(job))
            line = _seen(lambda: _events(cluster, REAL_NS), "FailedScheduling", "untolerated taint")
            print(f"[before] GKE's GPU taint: {line}", flush=True)
            cluster.kubectl("delete", "job", "-n", REAL_NS, "cuda-sample", "--wait=false")


# -- the refusal beside each platform's managed plugin -----------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["gke", "kubeadm"])
def test_other_plugin_refusal(
    cluster: Cluster, platform_node: tuple[RealNode, dict[str, str]], tmp_path: Path, name: str
) -> None:
    """E2, B1, G1, A2: beside a managed plugin offering ``nvidia.com/gpu`` the plugin refuses
    to start; its refusal names the platform's own switch, the platform told by the node's
    labels. Two platforms here, a node label's switch (GKE) and the operator's (kubeadm): the
    plugin's registration with the real kubelet is the same for all; every platform's words,
    EKS's and AKS's included, are checked on kwok nodes by ``test_platform_refusals.py``.
    Bottlerocket's is told by osImage, which kubelet reports from this machine."""
    node, images = platform_node
    platform = PLATFORMS[name]
    _fresh_namespaces(cluster)
    with node_look(cluster, node.name, labels=platform.labels), OtherPlugin():
        eventually(lambda: allocatable(node).get("nvidia.com/gpu") == "1", 60, "nvidia.com/gpu")
        with _installed(cluster, _defaults(cluster, node, images), tmp_path):
            # before (E2, B1, G1, A2): the refusal names only the GPU Operator's switch
            line = _seen(lambda: _plugin_log(cluster), "already offers nvidia.com/gpu=1")
            print(f"[before] another plugin ({name}): {line}", flush=True)
            assert platform.switch in line, f"{name}: {platform.switch!r} not in {line}"


@pytest.mark.e2e
def test_scc_defaults_as_openshift_gives_them(cluster: Cluster) -> None:
    """The stand-in for OpenShift's ``restricted-v2`` defaulting (``scc_defaults``), against
    the real API server: a pod that sets no ids gets the first of its namespace's range, as
    OpenShift documents; ids a pod sets are kept; a ``hostPID`` or privileged pod (only the
    ``privileged`` SCC, RunAsAny, admits those) is left alone."""
    namespace = "scc-defaults"

    def pod(name: str, **spec: Any) -> dict[str, Any]:
        container = {"name": "c", "image": "busybox", **spec.pop("container", {})}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": [container], "nodeName": "nowhere", **spec},
        }

    with scc_defaults(cluster, namespace):
        pods = [
            pod("plain"),
            pod("own-ids", securityContext={"runAsUser": 1000680007, "fsGroup": 1000680009}),
            pod("host-pid", hostPID=True),
            pod("privileged", container={"securityContext": {"privileged": True}}),
        ]
        cluster.kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps({"kind": "List", "apiVersion": "v1", "items": pods}),
        )
        got = {
            p["metadata"]["name"]: p["spec"].get("securityContext", {})
            for p in cluster.kubectl_json("get", "pods", "-n", namespace)["items"]
        }
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    first = SCC_RANGE_START
    assert got["plain"] == {"runAsUser": first, "fsGroup": first}, got
    assert got["own-ids"] == {"runAsUser": 1000680007, "fsGroup": 1000680009}, got
    assert "runAsUser" not in got["host-pid"] and "fsGroup" not in got["host-pid"], got
    assert "runAsUser" not in got["privileged"] and "fsGroup" not in got["privileged"], got
