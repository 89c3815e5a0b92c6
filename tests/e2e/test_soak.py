"""The soak (``make soak``, never in CI): thousands of containers of churn on the real node, with
its kubelet, containerd, device plugin and the extender restarted at random moments.

Pods of mixed shapes (many containers, init containers, a plain container beside GPU ones, two
GPUs, one large container) are created in waves while earlier ones finish, some are deleted
while they wait or run, and at seeded random moments one component is killed or stopped and
started again, with a wave of pods arriving while it is down. Every GPU container that ran is
compared with its pod's ``gpushare.io/allocation`` (``test_real_node.compare``), the memory the
live pods hold per GPU is summed from their annotations at each pass (over-commit: more than
the GPU has), and the device plugin's and the extender's resident memory is sampled. The summary
prints the containers checked, mismatches, over-commits, pods failed or stuck and why, and the
memory table; the goals are 0, 0, 0, 0 and no growth.

``GPUSHARE_SOAK_OUT`` names a folder for the summary, the memory samples and every
component's log. ``GPUSHARE_SOAK_CONTAINERS`` (default 10,000) stops the run once that many
containers were checked; ``GPUSHARE_SOAK_MINUTES`` (default 40) stops it anyway;
``GPUSHARE_SOAK_SEED`` (41) seeds the shapes, the deletions and the restarts, and
``GPUSHARE_SOAK_RESTART_GAP`` (``40,110``) bounds the seconds between two restarts.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import Cluster
from harness.helpers import per_gpu_memory
from harness.realnode import NODE_NAME, RealNode, container, pod
from tests.support.realnode import NS, compare, create, fresh_namespace, gpu_uuids, ns_pods, reasons

pytestmark = pytest.mark.skipif(
    os.environ.get("GPUSHARE_SOAK") != "1", reason="the soak runs with make soak (GPUSHARE_SOAK=1)"
)

CONTAINERS = int(os.environ.get("GPUSHARE_SOAK_CONTAINERS", "10000"))
MINUTES = float(os.environ.get("GPUSHARE_SOAK_MINUTES", "40"))
SEED = int(os.environ.get("GPUSHARE_SOAK_SEED", "41"))
GPUS, GPU_GIB = 8, 32
IN_FLIGHT = 30
WAVE = 12
FAILED_GRACE_S = 10.0
"""A Failed pod is counted once it stayed Failed (same UID) this long: the extender re-creates
a bare pod kubelet refused for want of the device plugin under the same name."""
STUCK_S = 900.0
"""A pod not finished this long after its creation is counted stuck (and deleted). Pods of
one shape wait in turn (the hand-off invariant: a second pod whose container would ask for the
same devices on the same GPU waits until the first has started), so a busy machine queues
them for minutes."""
RESTART_GAP_S = tuple(
    float(s) for s in os.environ.get("GPUSHARE_SOAK_RESTART_GAP", "40,110").split(",")
)
"""Seconds between two restarts, drawn uniformly (``GPUSHARE_SOAK_RESTART_GAP``)."""
RSS_EVERY_S = 30.0


def soak_pod(rng: random.Random, index: int) -> dict[str, Any]:
    """One pod of a random shape; its containers probe and exit at once or soon after."""

    def pause() -> str:
        return rng.choice(["true", "true", "true", "sleep 0.5", "sleep 2"])

    def gpu(name: str, mem: int) -> dict[str, Any]:
        return container(name, mem, command=pause())

    labels = {"app": "soak"}
    init = None
    shape = rng.random()
    if shape < 0.35:  # many small containers
        containers = [gpu(f"c{k}", rng.randint(1, 4)) for k in range(rng.randint(5, 9))]
    elif shape < 0.55:  # init containers before several containers
        init = [gpu(f"init{k}", rng.randint(1, 6)) for k in range(rng.randint(1, 2))]
        containers = [gpu(f"c{k}", rng.randint(1, 3)) for k in range(rng.randint(3, 7))]
    elif shape < 0.67:  # two GPUs
        labels["aliyun.com/gpu-count"] = "2"
        containers = [gpu(f"c{k}", 2 * rng.randint(1, 2)) for k in range(rng.randint(2, 6))]
    elif shape < 0.74:  # one large container
        containers = [gpu("main", rng.randint(8, 24))]
    elif shape < 0.88:  # a plain container beside the GPU ones
        containers = [gpu(f"c{k}", rng.randint(1, 3)) for k in range(rng.randint(3, 8))]
        containers.append({**container("plain"), "resources": {}})
    else:
        containers = [gpu(f"c{k}", rng.randint(1, 4)) for k in range(rng.randint(2, 7))]
    manifest = pod(f"soak-{index:05d}", NS, containers, labels=labels, init=init)
    manifest["spec"]["hostNetwork"] = True  # no CNI set-up per pod: the pace is kubelet's
    return manifest


def rss_kib(pid: int) -> int:
    """A process's resident memory in KiB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


@dataclass
class Tally:
    """What the soak saw."""

    created: int = 0
    checked: int = 0
    finished: int = 0
    deleted_early: int = 0
    mismatches: list[str] = field(default_factory=list)
    overcommits: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    restarts: list[str] = field(default_factory=list)
    recreated: int = 0
    """Pods the extender re-created under their name after kubelet refused them."""
    rss: list[tuple[float, str, int, int]] = field(default_factory=list)
    """(seconds since start, component, pid, RSS KiB)."""


def restarts(node: RealNode) -> dict[str, tuple[Callable[[], None], Callable[[], None]]]:
    """Each component's (down, up): pods are created between the two."""
    cluster = node.cluster

    def plugin_up() -> None:
        node.start_plugin()
        node.wait_capacity()

    def kubelet_down() -> None:
        node.expect_registration()
        node.kill("kubelet", 15)

    def kubelet_up() -> None:
        node.start_kubelet()
        node.wait_ready()
        node.wait_capacity()

    def containerd_up() -> None:
        node.start_containerd()
        node.wait_ready()

    return {
        "device plugin kill -9": (lambda: node.kill("gpushare-device-plugin", 9), plugin_up),
        "device plugin SIGTERM": (lambda: node.kill("gpushare-device-plugin", 15), plugin_up),
        "kubelet": (kubelet_down, kubelet_up),
        "containerd": (lambda: node.kill("containerd", 15), containerd_up),
        "extender kill -9": (cluster.kill_extender, lambda: cluster.start_extender()),
    }


def sample_rss(node: RealNode, tally: Tally, since: float) -> None:
    for name, processes in (
        ("device plugin", node.processes),
        ("extender", node.cluster.processes),
    ):
        key = "gpushare-device-plugin" if name == "device plugin" else "gpushare-extender"
        process = processes.get(key)
        if process is not None and process.alive():
            tally.rss.append((time.monotonic() - since, name, process.pid, rss_kib(process.pid)))


def overcommitted(items: list[dict[str, Any]]) -> list[str]:
    """GPUs whose live pods' annotations hold more memory than the GPU has."""
    live = [
        p
        for p in items
        if p["spec"].get("nodeName") == NODE_NAME
        and p["status"].get("phase") in ("Pending", "Running")
    ]
    return [
        f"GPU{index}: {held} GiB held > {GPU_GIB} GiB"
        for (_, index), held in per_gpu_memory(live).items()
        if held > GPU_GIB
    ]


def by_gpushare(item: dict[str, Any]) -> bool:
    """Whether a Failed pod failed for a reason gpushare owns (admission of its resources)."""
    text = reasons(item)
    return item["status"].get("reason") == "UnexpectedAdmissionError" or "aliyun.com" in text


def rss_table(tally: Tally) -> list[str]:
    """The memory samples, one line per component and incarnation: first, peak, last."""
    runs: dict[tuple[str, int], list[tuple[float, int]]] = {}
    for at, name, pid, kib in tally.rss:
        runs.setdefault((name, pid), []).append((at, kib))
    lines = [
        f"{'component':<14} {'pid':>7} {'from':>6} {'to':>6} {'first':>8} {'peak':>8} "
        f"{'last':>8}  (RSS MiB; from/to: seconds into the soak)"
    ]
    for (name, pid), samples in runs.items():
        values = [kib / 1024 for _, kib in samples]
        lines.append(
            f"{name:<14} {pid:>7} {samples[0][0]:>6.0f} {samples[-1][0]:>6.0f} "
            f"{values[0]:>8.1f} {max(values):>8.1f} {values[-1]:>8.1f}"
        )
    return lines


def summary(tally: Tally, elapsed: float, pending: list[str]) -> list[str]:
    gpushare_failed = [line for line in tally.failed if line.startswith("[gpushare]")]
    lines = [
        f"[soak] {elapsed / 60:.1f} min, seed {SEED}: {tally.created} pods created, "
        f"{tally.finished} finished, {tally.deleted_early} deleted early",
        f"[soak] containers checked {tally.checked}, allocation mismatches "
        f"{len(tally.mismatches)}, over-commits {len(tally.overcommits)}",
        f"[soak] pods failed {len(tally.failed)} (by gpushare {len(gpushare_failed)}), stuck "
        f"{len(tally.stuck)}, left unfinished {len(pending)}; re-created by the extender after "
        f"kubelet refused them {tally.recreated}",
        f"[soak] restarts ({len(tally.restarts)}): " + ", ".join(tally.restarts),
    ]
    for line in (tally.mismatches + tally.overcommits + tally.failed + tally.stuck)[:30]:
        lines.append(f"[soak]   {line}")
    return lines + [f"[soak] {line}" for line in rss_table(tally)]


def test_soak_on_the_real_node(real_node: RealNode, capsys: pytest.CaptureFixture[str]) -> None:
    cluster: Cluster = real_node.cluster
    real_node.set_mode("share", unit="1GiB", fake_gpus=f"{GPUS}x{GPU_GIB}GiB")
    fresh_namespace(cluster)
    rng = random.Random(SEED)
    actions = restarts(real_node)
    uuids = gpu_uuids(cluster)
    tally = Tally()
    born: dict[str, float] = {}
    uids: dict[str, str] = {}
    failed_since: dict[str, float] = {}
    gone: set[str] = set()
    started = time.monotonic()
    deadline = started + MINUTES * 60
    next_restart = started + rng.uniform(*RESTART_GAP_S)
    last_rss = last_report = 0.0

    def say(text: str) -> None:
        with capsys.disabled():
            print(text, flush=True)

    def wave() -> None:
        if tally.checked >= CONTAINERS:
            return
        manifests = [soak_pod(rng, tally.created + i) for i in range(WAVE)]
        create(cluster, manifests)
        now = time.monotonic()
        born.update({m["metadata"]["name"]: now for m in manifests})
        tally.created += len(manifests)

    try:
        while time.monotonic() < deadline:
            now = time.monotonic()
            if now - last_rss >= RSS_EVERY_S:
                last_rss = now
                sample_rss(real_node, tally, started)
            if now >= next_restart and tally.checked < CONTAINERS:
                what = rng.choice(sorted(actions))
                down, up = actions[what]
                t0 = time.monotonic()
                down()
                wave()  # pods arrive while it is down
                try:
                    up()
                    note = ""
                except Exception as err:  # recorded, then tried once more
                    note = f", came back only on a second try: {str(err)[:200]}"
                    up()
                took = time.monotonic() - t0
                tally.restarts.append(f"{what} at {t0 - started:.0f}s ({took:.1f}s{note})")
                say(f"[soak] {tally.restarts[-1]}")
                next_restart = time.monotonic() + rng.uniform(*RESTART_GAP_S)
            items = ns_pods(cluster)
            tally.overcommits.extend(f"{now - started:.0f}s {o}" for o in overcommitted(items))
            live = [p for p in items if p["metadata"]["name"] not in gone]
            for p in live:
                name, uid = p["metadata"]["name"], p["metadata"]["uid"]
                if uids.setdefault(name, uid) != uid:
                    uids[name] = uid
                    tally.recreated += 1
            finished = []
            for p in live:
                phase, name = p["status"].get("phase"), p["metadata"]["name"]
                if phase == "Succeeded":
                    finished.append(p)
                elif phase == "Failed":
                    first = failed_since.setdefault(p["metadata"]["uid"], now)
                    if now - first >= FAILED_GRACE_S:
                        finished.append(p)
                        owner = "[gpushare]" if by_gpushare(p) else "[other]"
                        tally.failed.append(f"{owner} {name}: {reasons(p)}")
            n, wrong, _ = compare(
                [p for p in finished if p["status"]["phase"] == "Succeeded"],
                uuids,
                real_node.device_list_strategy,
            )
            tally.checked += n
            tally.mismatches.extend(wrong)
            tally.finished += len(finished)
            unfinished = [p for p in live if p not in finished]
            in_grace = [p for p in unfinished if p["status"].get("phase") == "Failed"]
            victims, stuck = [], []
            for p in unfinished:
                name = p["metadata"]["name"]
                if now - born.get(name, now) > STUCK_S:
                    stuck.append(name)
                    tally.stuck.append(f"{name}: {p['status'].get('phase')} {reasons(p)}")
                elif p not in in_grace and rng.random() < 0.01:
                    victims.append(name)
            tally.deleted_early += len(victims)
            names = [p["metadata"]["name"] for p in finished] + victims + stuck
            gone.update(names)
            if names:
                cluster.kubectl(
                    "delete", "pods", "-n", NS, *names, "--wait=false", check=False, timeout=120
                )
            in_flight = len(unfinished) - len(victims) - len(stuck)
            if tally.checked >= CONTAINERS and in_flight == 0:
                break
            if in_flight < IN_FLIGHT:
                wave()
            if now - last_report > 30:
                last_report = now
                say(
                    f"[soak] {now - started:.0f}s: pods created {tally.created}, finished "
                    f"{tally.finished}, in flight {in_flight}; containers checked {tally.checked}"
                    f", mismatches {len(tally.mismatches)}, over-commits "
                    f"{len(tally.overcommits)}, failed {len(tally.failed)}, stuck "
                    f"{len(tally.stuck)}"
                )
            time.sleep(2)
        sample_rss(real_node, tally, started)
        pending = [
            f"{p['metadata']['name']}: {p['status'].get('phase')} {reasons(p)}"
            for p in ns_pods(cluster)
            if p["metadata"]["name"] not in gone
        ]
        lines = summary(tally, time.monotonic() - started, pending)
        say("\n" + "\n".join(lines))
        out = os.environ.get("GPUSHARE_SOAK_OUT")
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / "summary.txt").write_text("\n".join(lines) + "\n")
            (Path(out) / "samples.json").write_text(
                json.dumps({"rss": tally.rss, "failed": tally.failed, "stuck": tally.stuck})
            )
        assert tally.checked >= CONTAINERS, f"only {tally.checked} containers checked"
        assert not tally.mismatches and not tally.overcommits, lines[1]
        assert not [f for f in tally.failed if f.startswith("[gpushare]")], lines[2]
        assert not tally.stuck and not pending, lines[2]
    finally:
        out = os.environ.get("GPUSHARE_SOAK_OUT")
        if out:
            shutil.copytree(cluster.root / "logs", Path(out) / "logs", dirs_exist_ok=True)
        cluster.kubectl("delete", "namespace", NS, "--wait=true", timeout=300, check=False)
        real_node.set_mode("share", unit="1GiB", fake_gpus="4x15GiB")
