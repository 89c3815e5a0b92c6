"""Pods on the real node (containerd, kubelet, the device plugin): created, waited for, read,
and compared with what the scheduler booked; the ``ns`` fixture (a fresh namespace a test).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from harness.cluster import Cluster
from harness.images import TEST_IMAGE
from harness.realnode import (
    NODE_NAME,
    TOLERATION,
    RealNode,
    container,
    hand_off,
    pod,
    probe_env,
)
from tests.support.e2e import REPO, eventually

NS = "e2e-real"


MiB = 2**20


def statuses(item: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every container status of a pod (init containers included), by container name."""
    status = item.get("status", {})
    out = {}
    for key in ("initContainerStatuses", "containerStatuses"):
        for entry in status.get(key) or []:
            out[entry["name"]] = entry
    return out


def probed(entry: dict[str, Any]) -> dict[str, str] | None:
    """What /probe printed in a container, from its termination message, if it has one."""
    for state in ("terminated", "running"):
        terminated = (entry.get("state", {}).get(state) or {}).get("message")
        if terminated:
            return probe_env(terminated)
    last = (entry.get("lastState", {}).get("terminated") or {}).get("message")
    return probe_env(last) if last else None


def handed(
    gpus: list[tuple[int, int, int]], pod_mem: int, uuids: dict[int, str], strategy: str
) -> dict[str, str]:
    """The variables (and, read back from inside, device nodes) a container placed on ``gpus``
    (``(index, memory units, percent)`` in placement order) must have, its pod holding
    ``pod_mem`` units, for the device-list strategy: the one expectation of both modes."""
    gpus = [g for g in gpus if g[1] or g[2]]
    out = {
        "ALIYUN_COM_GPU_MEM_IDX": ",".join(str(index) for index, _, _ in gpus),
        "ALIYUN_COM_GPU_MEM_POD": str(pod_mem),
        **hand_off([index for index, _, _ in gpus], uuids, strategy),
    }
    mem = [g for g in gpus if g[1]]
    if mem:
        out["ALIYUN_COM_GPU_MEM_CONTAINER"] = str(sum(m for _, m, _ in mem))
        out["GPUSHARE_MEM_PER_GPU"] = ",".join(f"{index}:{m}" for index, m, _ in mem)
    cores = [core for _, _, core in gpus if core]
    if cores:
        out["ALIYUN_COM_GPU_CORE_PERCENTAGE"] = str(max(cores))
    return out


def expected(
    item: dict[str, Any], name: str, uuids: dict[int, str], strategy: str
) -> dict[str, str]:
    """What a container must have, from its pod's allocation record (device-plugin mode)."""
    record = json.loads(item["metadata"]["annotations"]["gpushare.io/allocation"])
    entry = next((c for c in record["containers"] if c["name"] == name), None)
    if entry is None:
        return {}
    gpus = [(g["index"], g["mem"], g["core"]) for g in entry["gpus"]]
    return handed(gpus, sum(g["mem"] for g in record["gpus"]), uuids, strategy)


Want = Callable[[dict[str, Any], str], dict[str, str] | str]
"""What a container of a pod must see, or why nothing can be compared (a mismatch)."""


def gpu_uuids(cluster: Cluster, node: str = NODE_NAME) -> dict[int, str]:
    annotations = cluster.kubectl_json("get", "node", node)["metadata"]["annotations"]
    return {g["index"]: g["uuid"] for g in json.loads(annotations["gpushare.io/gpus"])}


def gpu_containers(item: dict[str, Any]) -> list[str]:
    """Names of the pod's containers that ask for GPU memory or computing power: in their
    limits (device-plugin mode) or through a claim (a pod the webhook converted for DRA)."""
    spec = item["spec"]
    names = []
    for c in [*(spec.get("initContainers") or []), *spec["containers"]]:
        limits = c.get("resources", {}).get("limits", {})
        claims = c.get("resources", {}).get("claims") or []
        if "aliyun.com/gpu-mem" in limits or "aliyun.com/gpu-core.percentage" in limits or claims:
            names.append(c["name"])
    return names


def compare(
    items: list[dict[str, Any]], uuids: dict[int, str], strategy: str, want: Want | None = None
) -> tuple[int, list[str], dict[str, dict[str, str]]]:
    """(containers checked, mismatches, env by pod/container) for pods whose containers ran;
    ``want`` says what each must see (by default: its pod's allocation record)."""
    checked, mismatches, seen = 0, [], {}
    for item in items:
        states = statuses(item)
        for name in gpu_containers(item):
            got = probed(states.get(name, {}))
            if got is None:
                continue
            key = f"{item['metadata']['name']}/{name}"
            seen[key] = got
            wanted = want(item, name) if want else expected(item, name, uuids, strategy)
            checked += 1
            if isinstance(wanted, str):
                mismatches.append(f"{key}: {wanted}")
                continue
            wrong = {k: (got.get(k), v) for k, v in wanted.items() if got.get(k) != v}
            if wrong:
                mismatches.append(f"{key}: {wrong}")
    return checked, mismatches, seen


def ns_pods(cluster: Cluster, namespace: str = NS) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.kubectl_json("get", "pods", "-n", namespace)["items"]
    return items


def create(cluster: Cluster, manifests: list[dict[str, Any]]) -> None:
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests})
    cluster.kubectl("create", "-f", "-", input=body, timeout=300)


def wait_done(cluster: Cluster, names: set[str], timeout: float = 180) -> list[dict[str, Any]]:
    """Until every named pod has Succeeded; fail with the others' phase and last event."""

    def done() -> list[dict[str, Any]] | None:
        items = [p for p in ns_pods(cluster) if p["metadata"]["name"] in names]
        if len(items) == len(names) and all(p["status"].get("phase") == "Succeeded" for p in items):
            return items
        return None

    try:
        result: list[dict[str, Any]] = eventually(done, timeout, f"{len(names)} pods Succeeded")
    except AssertionError:
        lines = []
        for p in ns_pods(cluster):
            if p["metadata"]["name"] in names and p["status"].get("phase") != "Succeeded":
                lines.append(f"{p['metadata']['name']}: {p['status'].get('phase')} {reasons(p)}")
        raise AssertionError("pods not Succeeded:\n" + "\n".join(lines)) from None
    return result


def reasons(item: dict[str, Any]) -> str:
    """Why a pod is where it is: its conditions, its own reason, and each container that
    ended or waits with a reason (a pod failed by a containerd restart says so only there)."""
    status = item.get("status", {})
    parts = [f"{c.get('reason')}: {c.get('message')}" for c in status.get("conditions") or []]
    if status.get("message"):
        parts.append(f"{status.get('reason')}: {status['message']}")
    for kind in ("initContainerStatuses", "containerStatuses"):
        for entry in status.get(kind) or []:
            state = entry.get("state") or {}
            last = (entry.get("lastState") or {}).get("terminated")
            ended = state.get("terminated") or last
            waiting = state.get("waiting")
            if ended and (ended.get("exitCode") or ended.get("reason") != "Completed"):
                message = (ended.get("message") or "").strip()[:160]
                parts.append(
                    f"{entry.get('name')} {ended.get('reason')} exit {ended.get('exitCode')}"
                    + (f": {message}" if message else "")
                )
            elif waiting and waiting.get("reason"):
                message = (waiting.get("message") or "").strip()[:160]
                parts.append(
                    f"{entry.get('name')} {waiting['reason']}" + (f": {message}" if message else "")
                )
    return "; ".join(p for p in parts if "None: None" not in p)


def served(item: dict[str, Any]) -> bool:
    return (item["metadata"].get("annotations") or {}).get("ALIYUN_COM_GPU_MEM_ASSIGNED") == "true"


def fresh_namespace(cluster: Cluster) -> None:
    # a 500-pod namespace of the stress before takes about 2 minutes to go; 300 s leaves room
    cluster.kubectl("delete", "namespace", NS, "--ignore-not-found", "--wait=true", timeout=300)
    cluster.create_namespace(NS)


def local_job(path: str, *, command: list[str]) -> dict[str, Any]:
    """A seed manifest with the local image, its command replaced by the probe, on this node."""
    manifest: dict[str, Any] = yaml.safe_load((REPO / "examples" / path).read_text())
    spec = manifest["spec"]["template"]["spec"]
    spec["nodeSelector"] = {"kubernetes.io/hostname": NODE_NAME}
    spec["tolerations"] = [TOLERATION]
    spec["terminationGracePeriodSeconds"] = 1
    for c in spec["containers"]:
        c.update(image=TEST_IMAGE, imagePullPolicy="Never", command=command, workingDir="/")
        c.pop("args", None)
    manifest["metadata"]["namespace"] = NS
    return manifest


PROBE_THEN = "/probe; /probe > /dev/termination-log; "


@pytest.fixture
def ns(real_node: RealNode) -> Iterator[str]:
    """A fresh namespace for the test's pods, deleted (and waited for) afterwards, so the next
    test starts on a node that holds no GPU memory."""
    fresh_namespace(real_node.cluster)
    yield NS
    real_node.cluster.kubectl(
        "delete", "namespace", NS, "--ignore-not-found", "--wait=true", timeout=300, check=False
    )


def logged(cluster: Cluster, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods with each GPU container's /probe output from ``kubectl logs`` put where
    :func:`compare` reads it (for containers still running)."""
    out = []
    for item in items:
        copy = json.loads(json.dumps(item))
        for entry in statuses(copy).values():
            if entry["name"] in gpu_containers(copy) and not probed(entry):
                text = cluster.kubectl(
                    "logs", "-n", NS, copy["metadata"]["name"], "-c", entry["name"]
                ).stdout
                entry.setdefault("state", {})["terminated"] = {"message": text}
        out.append(copy)
    return out


def wait_done_label(cluster: Cluster, selector: str, timeout: float = 120) -> list[dict[str, Any]]:
    def done() -> list[dict[str, Any]] | None:
        items: list[dict[str, Any]] = cluster.kubectl_json("get", "pods", "-n", NS, "-l", selector)[
            "items"
        ]
        ok = [p for p in items if p["status"].get("phase") == "Succeeded"]
        if ok:
            return ok
        failed = [p for p in items if p["status"].get("phase") == "Failed"]
        assert not failed, [reasons(p) for p in failed]
        return None

    result: list[dict[str, Any]] = eventually(done, timeout, f"{selector} Succeeded")
    return result


# -- the randomized stress --------------------------------------------------------------------

STRESS_WAVE = 30
STRESS_IN_FLIGHT = 70


def random_pod(rng: random.Random, index: int) -> dict[str, Any]:
    """One pod of a random shape: 1-8 units, sometimes two containers, an init container or
    two GPUs; each container runs for a random moment after probing."""
    pause = f"sleep {rng.choice(['0', '0.5', '1', '2', '3'])}"
    shape = rng.random()
    labels = {"app": "stress"}
    init = None
    if shape < 0.15:
        containers = [
            container("a", rng.randint(1, 4), command=pause),
            container("b", rng.randint(1, 4), command=pause),
        ]
    elif shape < 0.25:
        labels["aliyun.com/gpu-count"] = "2"
        containers = [container("main", 2 * rng.randint(1, 4), command=pause)]
    elif shape < 0.35:
        containers = [container("main", rng.randint(1, 4), command=pause)]
        init = [container("setup", rng.randint(1, 6))]
    else:
        containers = [container("main", rng.randint(1, 8), command=pause)]
    manifest = pod(f"st-{index:04d}", NS, containers, labels=labels, init=init)
    manifest["spec"]["hostNetwork"] = True  # no CNI set-up per pod: the kubelet's pace is the
    return manifest  # device plugin's and the runtime's, not the bridge plugin's


Check = Callable[[list[dict[str, Any]]], tuple[int, list[str]]]
"""(containers checked, mismatches) for pods that Succeeded."""


@dataclass
class StressRun:
    """What a stress run did: pods created, finished and deleted early, containers checked,
    the mismatches and the pods left unfinished (with why), and how long it took."""

    created: int = 0
    finished: set[str] = field(default_factory=set)
    deleted_early: set[str] = field(default_factory=set)
    checked: int = 0
    mismatches: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    elapsed: float = 0.0

    def summary(self, tag: str = "stress") -> str:
        return (
            f"[{tag}] {self.created} pods in {self.elapsed:.0f}s: {len(self.finished)} finished, "
            f"{len(self.deleted_early)} deleted early; {self.checked} containers checked, "
            f"{len(self.mismatches)} mismatches; {len(self.pending)} left Pending"
        )


def run_stress(
    cluster: Cluster,
    rng: random.Random,
    total: int,
    check: Check,
    *,
    tag: str = "stress",
    timeout: float = 900,
) -> StressRun:
    """Create ``total`` random pods in waves, at most ``STRESS_IN_FLIGHT`` unfinished at once,
    delete each once it finished (after ``check`` read it) and some at random while they wait
    or run; until all are gone or ``timeout``. A pod that Failed is a mismatch."""
    run = StressRun()
    started = time.monotonic()
    deadline = started + timeout
    last_report = 0.0
    while time.monotonic() < deadline:
        items = ns_pods(cluster)
        live = [p for p in items if p["metadata"]["name"] not in run.finished | run.deleted_early]
        finished = [p for p in live if p["status"].get("phase") in ("Succeeded", "Failed")]
        failed = [p for p in finished if p["status"]["phase"] == "Failed"]
        for p in failed:
            run.mismatches.append(f"{p['metadata']['name']} Failed: {reasons(p)}")
        n, wrong = check([p for p in finished if p not in failed])
        run.checked += n
        run.mismatches.extend(wrong)
        names = [p["metadata"]["name"] for p in finished]
        run.finished.update(names)
        # some pods are deleted while they wait or run, at random
        unfinished = [p for p in live if p not in finished]
        victims = [p["metadata"]["name"] for p in unfinished if rng.random() < 0.03]
        run.deleted_early.update(victims)
        if names or victims:
            cluster.kubectl(
                "delete", "pods", "-n", NS, *names, *victims, "--wait=false", check=False
            )
        in_flight = len(unfinished) - len(victims)
        if run.created < total and in_flight < STRESS_IN_FLIGHT:
            count = min(STRESS_WAVE, total - run.created)
            create(cluster, [random_pod(rng, run.created + i) for i in range(count)])
            run.created += count
        elif run.created >= total and in_flight == 0:
            break
        if time.monotonic() - last_report > 15:
            last_report = time.monotonic()
            print(
                f"[{tag}] {time.monotonic() - started:.0f}s: created {run.created}/{total}, "
                f"finished {len(run.finished)}, deleted early {len(run.deleted_early)}, in "
                f"flight {in_flight}, containers checked {run.checked}, mismatches "
                f"{len(run.mismatches)}",
                flush=True,
            )
        time.sleep(1)
    run.pending = [
        f"{p['metadata']['name']}: {p['status'].get('phase')} {reasons(p)}"
        for p in ns_pods(cluster)
        if p["metadata"]["name"] not in run.finished | run.deleted_early
    ]
    run.elapsed = time.monotonic() - started
    return run


def run_cuda_sample(cluster: Cluster) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The seed's cuda-sample Job (2 GiB, 30 % of a core_mem GPU) run to its end on this node:
    its pods and what the probe in its container saw, checked as the seed document says. Both
    modes run it, so the same checks hold for device-plugin and DRA mode."""
    job = local_job("cuda-sample.yaml", command=["/bin/sh", "-c", PROBE_THEN + "sleep 2"])
    cluster.kubectl("apply", "-f", "-", input=json.dumps(job))
    items = wait_done_label(cluster, "job-name=cuda-sample")
    name = items[0]["metadata"]["name"]
    env = probe_env(cluster.kubectl("logs", "-n", NS, name).stdout)
    print(env)
    assert env["ALIYUN_COM_GPU_MEM_CONTAINER"] == "2"
    assert env["ALIYUN_COM_GPU_CORE_PERCENTAGE"] == "30"
    assert env["GPUSHARE_CORE_LIMIT"] == "30"
    # its own slice of each period, from the GPU's schedule (mounted read-only: it started)
    assert env["GPUSHARE_CGPU_POLICY"] == "3"
    assert env["GPUSHARE_MEM_LIMIT"] == str(2 * 1024**3)
    assert "libgpushare-cuda.so" in env["PROBE_MAPPED"], env
    return items, env
