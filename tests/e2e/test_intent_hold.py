"""Pods that never bind do not hold the GPUs their intents booked, and the refused pods come back.

Eight 15 GiB pods each mount a claim of a ``WaitForFirstConsumer`` StorageClass whose
provisioner does not exist. kube-scheduler's filters pass them, the extender's prioritize books
each one's GPU as an intent, and the pods then wait in VolumeBinding's PreBind for a volume that
never comes (10 minutes), so no bind ever reaches the extender. A 15 GiB pod of another
namespace, created once the pool is booked, is refused on every GPU.

Before the fix the intents were given back only at the next filter call, and kube-scheduler,
seeing no event, tried the refused pod again only at its 5-minute flush: in a quiet cluster it
waited over 5 minutes. Then the extender gave intents back by the clock (30 s after booking)
and touched the pods it refused meanwhile, which kube-scheduler takes as a reason to try them
again: the victim was bound about 30 s after the pool was booked. Now an intent older than
5 s gives way to a pod that fits nowhere else (``core.decision.yielding``), and the pods
refused meanwhile are touched when it does: the victim is bound within seconds.

Then seven more such pods of the same namespace arrive, one for each GPU left, while the first
eight still wait. A namespace with a pod whose intent ran out and that is still pending books
no intents (its pods are placed as before, with nothing held for them), so a second victim,
created once kube-scheduler has sent all seven into PreBind, is bound at once instead of
waiting another 30 s (105 GiB held by the seven before this rule).
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from collections.abc import Collection
from typing import Any

import pytest

from gpushare.core.model.inventory import Mode
from harness.cluster import Cluster
from harness.helpers import apply_all, gpu_pod_manifest, pods
from harness.seeding import labelled_kwok_nodes
from tests.support.e2e import create_nodes, delete_nodes

ATTACK_NS = "e2e-hold-attack"
VICTIM_NS = "e2e-hold-victim"
STORAGE_CLASS = "e2e-never-provisioned"
NODES = ["hold-0", "hold-1"]
GPU_MEM = 16
POD_MEM = 15
ATTACKERS = 8
LIMIT_S = float(os.environ.get("GPUSHARE_E2E_HOLD_LIMIT_S", "75"))
SECOND_LIMIT_S = 20.0
"""How long the second victim may wait: kube-scheduler's back-off at most, no intent's 30 s."""
SELECTED_NODE = "volume.kubernetes.io/selected-node"
"""The annotation VolumeBinding's PreBind writes on a claim it waits for."""
"""How long the victim may wait: the intent's 30 s, kube-scheduler's back-off (up to 10 s) and
slack for a loaded machine; before the fix it waited for the 5-minute flush."""


def _held(cluster: Cluster, nodes: Collection[str] = NODES) -> int:
    """GPU memory the extender's ledger holds on ``nodes`` (bookings, intents included)."""
    with urllib.request.urlopen(f"{cluster.extender_url}/inspect", timeout=5) as response:
        view = json.load(response)
    return sum(
        gpu["allocatedUnits"]
        for node in view["nodes"]
        if node["name"] in nodes
        for gpu in node["gpus"]
    )


STORAGE_CLASS_MANIFEST = {
    "apiVersion": "storage.k8s.io/v1",
    "kind": "StorageClass",
    "metadata": {"name": STORAGE_CLASS},
    "provisioner": "example.invalid/never",
    "volumeBindingMode": "WaitForFirstConsumer",
}
"""Claims of this class wait for their first consumer, and no provisioner ever comes."""


def _wait_held(
    cluster: Cluster, nodes: Collection[str], amount: int, what: str, every_s: float
) -> None:
    """Until the extender's ledger holds ``amount`` on ``nodes`` (two minutes at most)."""
    deadline = time.monotonic() + 120
    while _held(cluster, nodes) < amount:
        assert time.monotonic() < deadline, f"{what} never booked: {_held(cluster, nodes)}"
        time.sleep(every_s)


def _mount_claim(pod: dict[str, Any], claim: str) -> None:
    """The pod's container mounts ``claim``, so PreBind waits for it."""
    pod["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]


def _claim(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": ATTACK_NS},
        "spec": {
            "storageClassName": STORAGE_CLASS,
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }


def _attacker(index: int, selector: dict[str, str]) -> dict[str, Any]:
    pod = gpu_pod_manifest(f"hold-{index}", ATTACK_NS, POD_MEM, selector=selector)
    claim = f"never-{index}"
    _mount_claim(pod, claim)
    return pod


def _in_prebind(cluster: Cluster, claims: list[str]) -> int:
    """How many of these claims kube-scheduler's PreBind is waiting for."""
    items = cluster.kubectl_json("get", "pvc", "-n", ATTACK_NS)["items"]
    return sum(
        1
        for c in items
        if c["metadata"]["name"] in claims
        and SELECTED_NODE in (c["metadata"].get("annotations") or {})
    )


def _wait_bound(cluster: Cluster, name: str, limit_s: float) -> tuple[bool, float]:
    """Create a 15 GiB pod in the victims' namespace; whether it was bound, and how soon."""
    selector = {"gpushare-e2e": "intent-hold"}
    apply_all(cluster, [gpu_pod_manifest(name, VICTIM_NS, POD_MEM, selector=selector)])
    created = time.monotonic()
    while name not in _bound(cluster, VICTIM_NS) and time.monotonic() - created < limit_s:
        time.sleep(0.5)
    return name in _bound(cluster, VICTIM_NS), time.monotonic() - created


def _bound(cluster: Cluster, namespace: str) -> list[str]:
    return [p["metadata"]["name"] for p in pods(cluster, namespace) if p["spec"].get("nodeName")]


def test_pods_stuck_in_prebind_do_not_hold_the_pool_from_other_tenants(cluster: Cluster) -> None:
    create_nodes(
        cluster,
        labelled_kwok_nodes(NODES, "intent-hold", gpus_units=[GPU_MEM] * 4, mode=Mode.SHARE),
    )
    selector = {"gpushare-e2e": "intent-hold"}
    for namespace in (ATTACK_NS, VICTIM_NS):
        cluster.create_namespace(namespace)
    try:
        apply_all(
            cluster, [STORAGE_CLASS_MANIFEST, *(_claim(f"never-{i}") for i in range(ATTACKERS))]
        )
        apply_all(cluster, [_attacker(i, selector) for i in range(ATTACKERS)])
        _wait_held(cluster, NODES, ATTACKERS * POD_MEM, "the pool was", every_s=0.2)
        booked = time.monotonic()
        apply_all(cluster, [gpu_pod_manifest("victim", VICTIM_NS, POD_MEM, selector=selector)])
        created = time.monotonic()
        freed = None
        while not _bound(cluster, VICTIM_NS) and time.monotonic() - created < LIMIT_S:
            if freed is None and _held(cluster) < ATTACKERS * POD_MEM:
                freed = time.monotonic()
            time.sleep(0.5)
        waited = time.monotonic() - created
        bound = _bound(cluster, VICTIM_NS)
        stuck = _bound(cluster, ATTACK_NS)
        report = {
            "victim_bound": bool(bound),
            "victim_waited_s": round(waited, 1),
            "pool_held_s": round((freed or time.monotonic()) - booked, 1),
            "attackers_bound": len(stuck),
        }
        print(f"[intent-hold] {report}", flush=True)
        assert not stuck, f"attackers bound, so nothing was held: {stuck}"
        assert bound, f"the victim waited over {LIMIT_S:.0f}s for GPUs held by pods never bound"

        # as many as there are GPUs left: with intents, each would hold one for 30 s
        wave = range(ATTACKERS, 2 * ATTACKERS - 1)
        claims = [f"never-{i}" for i in wave]
        apply_all(cluster, [_claim(c) for c in claims])
        apply_all(cluster, [_attacker(i, selector) for i in wave])
        deadline = time.monotonic() + 120
        while _in_prebind(cluster, claims) < len(claims):
            assert time.monotonic() < deadline, "the second wave never reached PreBind"
            time.sleep(0.5)
        held = _held(cluster)
        second, waited = _wait_bound(cluster, "victim-2", SECOND_LIMIT_S)
        report = {"second_victim_waited_s": round(waited, 1), "held_by_second_wave": held - POD_MEM}
        print(f"[intent-hold] {report}", flush=True)
        assert second, f"the second victim waited over {SECOND_LIMIT_S:.0f}s: {held} GiB held"
    finally:
        for namespace in (ATTACK_NS, VICTIM_NS):
            cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "storageclass", STORAGE_CLASS, "--wait=false", check=False)
        delete_nodes(cluster, NODES)


WAVE_NODES = ["wave-0", "wave-1"]
WAVE_SELECTOR = {"gpushare-e2e": "intent-waves"}
WAVE_ATTACKERS = 4
"""Half the pool (8 GPUs of 16 GiB): one 15 GiB pod on each of four GPUs."""
VICTIMS = 8
WAVE_S = 25.0
WINDOW_S = 60.0
"""How long the attack is watched after the victims are created."""
VICTIMS_LIMIT_S = float(os.environ.get("GPUSHARE_E2E_WAVES_LIMIT_S", "30"))
"""How long the last victim may wait: ``HOLD_S`` (5 s), kube-scheduler's back-off (at most
10 s), a sweep, and slack for a loaded machine. Before intents gave way the last victim waited
52 s (same namespace) and 134 s (a new namespace each wave) on the CI machine."""


def _stuck_pod(cluster: Cluster, namespace: str, wave: int, i: int, fresh: bool) -> str:
    """A 15 GiB pod waiting for a claim that never binds (the claim made with it when fresh)."""
    claim = f"never-{wave}-{i}" if fresh else f"never-{i}"
    manifests: list[dict[str, Any]] = []
    if fresh or wave == 0:
        manifests.append(_claim(claim) | {"metadata": {"name": claim, "namespace": namespace}})
    pod = gpu_pod_manifest(f"hold-w{wave}-{i}", namespace, POD_MEM, selector=WAVE_SELECTOR)
    _mount_claim(pod, claim)
    manifests.append(pod)
    apply_all(cluster, manifests)
    return str(pod["metadata"]["name"])


@pytest.mark.parametrize("new_namespace_each_wave", [False, True], ids=["same-ns", "new-ns"])
def test_waves_of_re_created_stuck_pods_do_not_keep_victims_out(
    cluster: Cluster, new_namespace_each_wave: bool
) -> None:
    """Issue 56's fourth attack: pods whose WaitForFirstConsumer claim never binds, deleted and
    created again every 25 s (or in a new namespace each wave), hold half the pool; 8 victims of
    another tenant must all be bound within ``VICTIMS_LIMIT_S``.

    Before intents gave way (``core.decision.yielding``), each new pod was new to every rule
    that remembered pods or namespaces: victims bound only when they won the race for a share
    the attack had just let go (on the issue's cluster 3 or 4 of 8 never did in 150 s).
    """
    create_nodes(
        cluster,
        labelled_kwok_nodes(WAVE_NODES, "intent-waves", gpus_units=[GPU_MEM] * 4, mode=Mode.SHARE),
    )
    suffix = "ns" if new_namespace_each_wave else "same"
    victims_ns = f"e2e-waves-victim-{suffix}"
    attack = [f"e2e-waves-attack-{suffix}-0"]
    cluster.create_namespace(victims_ns)
    cluster.create_namespace(attack[0])
    stop = threading.Event()
    waves: list[float] = []
    try:
        cluster.kubectl("apply", "-f", "-", input=json.dumps(STORAGE_CLASS_MANIFEST))
        current = [
            (attack[0], _stuck_pod(cluster, attack[0], 0, i, new_namespace_each_wave))
            for i in range(WAVE_ATTACKERS)
        ]
        _wait_held(cluster, WAVE_NODES, WAVE_ATTACKERS * POD_MEM, "the attack", every_s=0.5)

        def attacker() -> None:
            """Each pod deleted and created again every 25 s, one every 25/4 s, so that a
            pod of the attack is always new and the rest always hold."""
            wave = 0
            while True:
                wave += 1
                namespace = attack[0]
                if new_namespace_each_wave:
                    namespace = f"e2e-waves-attack-{suffix}-{wave}"
                    cluster.create_namespace(namespace)
                    attack.append(namespace)
                for i in range(WAVE_ATTACKERS):
                    if stop.wait(WAVE_S / WAVE_ATTACKERS):
                        return
                    old_ns, old = current[i]
                    cluster.kubectl(
                        "delete", "pod", "-n", old_ns, old, "--grace-period=0", "--force",
                        "--wait=false", check=False,
                    )  # fmt: skip
                    made = _stuck_pod(cluster, namespace, wave, i, new_namespace_each_wave)
                    current[i] = (namespace, made)
                    waves.append(time.monotonic())

        thread = threading.Thread(target=attacker, daemon=True)
        thread.start()
        victims = [
            gpu_pod_manifest(f"victim-{i}", victims_ns, POD_MEM, selector=WAVE_SELECTOR)
            for i in range(VICTIMS)
        ]
        apply_all(cluster, victims)
        created = time.monotonic()
        bound_at: dict[str, float] = {}
        samples: list[int] = []
        while time.monotonic() - created < WINDOW_S:
            for name in _bound(cluster, victims_ns):
                bound_at.setdefault(name, round(time.monotonic() - created, 1))
            samples.append(_held(cluster, WAVE_NODES) - POD_MEM * len(bound_at))
            time.sleep(1.0)
        observed = time.monotonic() - created
        stop.set()
        thread.join(60)
        half = WAVE_ATTACKERS * POD_MEM
        report = {
            "variant": "new namespace each wave" if new_namespace_each_wave else "same namespace",
            "victims_bound": f"{len(bound_at)}/{VICTIMS}",
            "bound_after_s": sorted(bound_at.values()),
            "observed_s": round(observed, 1),
            "attacker_pods_re_created": len(waves),
            "attacker_held_half_the_pool_s": f"{sum(1 for held in samples if held >= half)} "
            f"of {len(samples)}",
            "attacker_mean_share_of_pool": round(
                sum(samples) / max(len(samples), 1) / (GPU_MEM * 8), 2
            ),
        }
        print(f"[intent-waves] {report}", flush=True)
        assert len(bound_at) == VICTIMS, f"victims never bound in {WINDOW_S:.0f}s: {report}"
        late = [name for name, after in bound_at.items() if after > VICTIMS_LIMIT_S]
        assert not late, f"victims bound after {VICTIMS_LIMIT_S:.0f}s: {late}: {report}"
    finally:
        stop.set()
        for namespace in (victims_ns, *attack):
            cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "storageclass", STORAGE_CLASS, "--wait=false", check=False)
        delete_nodes(cluster, WAVE_NODES)
