"""cGPU policy 2 on the real node: weights from the pod spec, activity from the interposer.

The device plugin runs with ``--cgpu-policy 2 --max-pods-per-gpu 8``. Two pods on one GPU ask
for weights 1 and 3 in their spec (``ALIYUN_COM_GPU_SCHD_WEIGHT``); each container then sets
the variable to 8 in its own shell and runs ``/launches`` (the fake driver, CPU only, through
the preloaded interposer) in rounds, printing after each round its share of its fake SM and the
GPU's schedule file as it reads it. The schedule must name both containers with their spec's
weights and give them a quarter and three quarters of the period while both launch; the
variable each process set changes nothing. The limits file names the policy and the slot, and
the schedule directory is mounted read-only. The second pod is created once the first runs but
before the plugin may have marked it served, so Allocate may see both as candidates and give the
lower weight: the schedule must still come to each pod's own.

Pods with an ``emptyDir`` moved over the isolation (through a link in the image, or straight at
the schedules where no admission runs) are refused by the runtime before they run, while the
victim beside them keeps its schedule.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from harness.cluster import Cluster
from harness.realnode import RealNode, container, pod, probe_env
from tests.support.e2e import eventually
from tests.support.realnode import NS, create, fresh_namespace, ns_pods, reasons, wait_done

PERIOD_NS = 100_000_000
ROUNDS = 14

# Each round: launch flat out for 2 s, then print the share and the schedule lines (slot= and
# member=) the container sees; the limits file and the mounts first.
SCRIPT = (
    "sed -n 's/^\\(policy\\|weight\\|slot\\|gpus\\|sched_dir\\)=/LIMITS_\\1=/p' "
    "/etc/gpushare/limits; "
    'awk \'$2 == "/run/gpushare-sched" {print "SCHED_MOUNT=" substr($4, 1, 2)}\' '
    "/proc/mounts; "
    "gpu=$(sed -n 's/^gpus=//p' /etc/gpushare/limits); "
    "sched=/var/run/gpushare-sched/gpu$gpu; "
    'if (: >> "$sched") 2>/dev/null; then echo SCHED_WRITABLE=yes; '
    "else echo SCHED_WRITABLE=no; fi; "
    "export ALIYUN_COM_GPU_SCHD_WEIGHT=8; echo PROCESS_WEIGHT=$ALIYUN_COM_GPU_SCHD_WEIGHT; "
    f"for i in $(seq 1 {ROUNDS}); do "
    '  echo "ROUND $i $(/launches 2 2>&1 | tr "\\n" " ")"; '
    '  echo "SEEN $i $(grep -E "^(slot|member)=" "$sched" | tr "\\n" " ")"; '
    "done"
)


def weighted(name: str, weight: int) -> dict[str, Any]:
    """A pod of 5 GiB whose spec asks for ``weight``."""
    spec = container("main", 5, command=SCRIPT)
    spec["env"] = [{"name": "ALIYUN_COM_GPU_SCHD_WEIGHT", "value": str(weight)}]
    return pod(name, NS, [spec])


def wait_running(cluster: Cluster, name: str, timeout: float = 120) -> None:
    cluster.kubectl(
        "wait", "-n", NS, f"pod/{name}", "--for=jsonpath={.status.phase}=Running",
        f"--timeout={int(timeout)}s", timeout=timeout + 10,
    )  # fmt: skip


def rounds(log: str) -> list[tuple[float, dict[str, int], dict[str, tuple[int, int]]]]:
    """Per round: this container's share (%), the slots (owner -> length) and the members
    (slot -> (weight, active)) of the schedule it read after the round."""
    found = re.findall(r"^ROUND (\d+) .*own=([\d.]+)", log, re.M)
    shares = {int(i): float(own) for i, own in found}
    out = []
    for i, seen in re.findall(r"^SEEN (\d+) (.*)$", log, re.M):
        slots = {o: int(n) for o, _, n in re.findall(r"slot=([^,\s]+),(\d+),(\d+)", seen)}
        members = {
            s: (int(w), int(a)) for s, w, a in re.findall(r"member=([^,\s]+),(\d+),(\d)", seen)
        }
        out.append((shares.get(int(i), -1.0), slots, members))
    return out


@pytest.fixture
def ns(real_node: RealNode) -> Any:
    fresh_namespace(real_node.cluster)
    yield NS
    real_node.cluster.kubectl(
        "delete", "namespace", NS, "--ignore-not-found", "--wait=true", timeout=300, check=False
    )
    # the next test gets the plugin with the default policy back
    real_node.set_mode("cgpu", unit="1GiB")


def test_weighted_policy_takes_weights_from_the_pod_spec(
    real_node: RealNode, ns: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = real_node.cluster
    real_node.set_mode("cgpu", unit="1GiB", extra=("--cgpu-policy", "2", "--max-pods-per-gpu", "8"))
    # one after the other, so each is the only pod kubelet may be admitting for its answer
    create(cluster, [weighted("light", 1)])
    wait_running(cluster, "light")
    create(cluster, [weighted("heavy", 3)])
    wait_done(cluster, {"light", "heavy"}, 240)
    logs = {n: cluster.kubectl("logs", "-n", NS, n).stdout for n in ("light", "heavy")}
    env = {n: probe_env(text) for n, text in logs.items()}
    with capsys.disabled():
        for name, text in logs.items():
            print(f"\n[real node] {name}:\n{text}", flush=True)
    light, heavy = env["light"], env["heavy"]
    for e in (light, heavy):
        assert e["LIMITS_policy"] == "2" and e["GPUSHARE_CGPU_POLICY"] == "2"
        assert re.fullmatch(r"[0-9a-f]{16}", e["LIMITS_slot"])
        assert e["LIMITS_sched_dir"] == "/var/run/gpushare-sched"
        assert (e["SCHED_MOUNT"], e["SCHED_WRITABLE"]) == ("ro", "no")
        assert e["PROCESS_WEIGHT"] == "8"  # what the process set; nobody reads it
    # Allocate gives heavy the lowest weight of the pods it may be admitting (light may not be
    # marked served yet: both wait with one signature); the schedule has each pod's own once
    # PodResources names them
    assert light["LIMITS_weight"] == "1" and heavy["LIMITS_weight"] in ("1", "3")
    assert light["LIMITS_gpus"] == heavy["LIMITS_gpus"], "the two pods must share a GPU"
    a, b = light["LIMITS_slot"], heavy["LIMITS_slot"]
    both = [
        (name, share, slots)
        for name in ("light", "heavy")
        for share, slots, members in rounds(logs[name])
        if members.get(a) == (1, 1) and members.get(b) == (3, 1)
    ]
    assert both, "no round saw both containers active with their spec's weights"
    for _, _, slots in both:
        assert slots == {a: PERIOD_NS // 4, b: PERIOD_NS * 3 // 4}, slots
    # while both launched, each got about its slice of its (own) fake SM
    light_shares = [share for name, share, _ in both if name == "light"]
    heavy_shares = [share for name, share, _ in both if name == "heavy"]
    with capsys.disabled():
        print(f"\n[real node] both active: light {light_shares} %, heavy {heavy_shares} %")
    assert light_shares and heavy_shares
    assert max(light_shares) < 40 and max(heavy_shares) > 50


# Volumes over the isolation: through the links a hostile image holds (harness/images.py
# HOSTILE_LINKS), which admission cannot see, and one straight at the schedules, which it would
# refuse: the real-node namespace has no admission webhook, like a namespace labelled
# gpushare.io/webhook=skip. The runtime's check (gpushare-mountcheck, a createRuntime hook the
# plugin's CDI spec names) refuses every one before it runs; the victim on the same GPU keeps
# its schedule and its share. Each attack's name, its volume's path and the path refused.
ATTACKS = {
    "link-sched": ("/x/y/z/sched", "/var/run/gpushare-sched"),
    "link-limits": ("/x/y/z/conf", "/etc/gpushare/limits"),
    "link-etc": ("/x/y/z/etc", "/etc/ld.so.preload"),
    "link-lib": ("/x/y/z/lib", "/usr/local/gpushare"),
    "link-broker": ("/x/y/z/broker", "/var/run/gpushare"),
    "direct-sched": ("/var/run/gpushare-sched", "/var/run/gpushare-sched"),
}
ATTACK_ROUNDS = 4
ATTACK = (
    "ls -A /var/run/gpushare-sched | sed 's/^/SCHED_FILE=/'; "
    f"for i in $(seq 1 {ATTACK_ROUNDS}); do "
    '  echo "ROUND $i $(/launches 2 2>&1 | tr "\\n" " ")"; '
    "done"
)


def refusal(item: dict[str, Any]) -> str:
    """The message of the container's failed start, or ""."""
    for entry in item["status"].get("containerStatuses") or []:
        for state in (entry.get("state") or {}, entry.get("lastState") or {}):
            for phase in ("waiting", "terminated"):
                message = (state.get(phase) or {}).get("message") or ""
                if "gpushare-mountcheck" in message:
                    return str(message)
    return ""


def test_volumes_moved_over_the_isolation_are_refused_by_the_runtime(
    real_node: RealNode, ns: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = real_node.cluster
    real_node.set_mode("cgpu", unit="1GiB", extra=("--cgpu-policy", "2", "--max-pods-per-gpu", "8"))
    attackers = []
    for name, (path, _) in ATTACKS.items():
        manifest = pod(name, NS, [container("main", 5, command=ATTACK)])
        manifest["spec"]["volumes"] = [{"name": "mine", "emptyDir": {}}]
        manifest["spec"]["containers"][0]["volumeMounts"] = [{"name": "mine", "mountPath": path}]
        attackers.append(manifest)
    create(cluster, attackers)
    victim = pod("victim", NS, [container("main", 5, command=ATTACK)])
    create(cluster, [victim])

    def ended() -> dict[str, dict[str, Any]] | None:
        """Every attacker refused or finished, and the victim finished."""
        items = {p["metadata"]["name"]: p for p in ns_pods(cluster)}
        over = {
            n: p for n, p in items.items() if refusal(p) or p["status"].get("phase") != "Pending"
        }
        finished = all(
            n in over and (refusal(over[n]) or over[n]["status"].get("phase") != "Running")
            for n in (*ATTACKS, "victim")
        )
        return items if finished else None

    items = eventually(ended, 300, "every attacker refused or finished, and the victim finished")
    logs = {
        n: cluster.kubectl("logs", "-n", NS, n, check=False).stdout for n in (*ATTACKS, "victim")
    }
    shares = {
        n: [float(s) for s in re.findall(r"^ROUND \d+ .*own=([\d.]+)", text, re.M)]
        for n, text in logs.items()
    }
    messages = {name: refusal(items[name]) for name in ATTACKS}
    with capsys.disabled():
        for name in ATTACKS:
            seen = messages[name][-300:] or f"ran: {shares[name]} %\n{logs[name]}"
            print(f"\n[real node] {name}: {seen}", flush=True)
        print(f"\n[real node] victim {shares['victim']} %:\n{logs['victim']}", flush=True)
    for name, (_, refused_path) in ATTACKS.items():
        assert f"{refused_path} " in messages[name] or f"{refused_path}:" in messages[name], (
            name,
            messages[name] or logs[name],
        )
        assert "ROUND" not in logs[name], (name, logs[name])  # it never ran
    assert items["victim"]["status"].get("phase") == "Succeeded", reasons(items["victim"])
    assert "SCHED_FILE=gpu" in logs["victim"]
    assert len(shares["victim"]) == ATTACK_ROUNDS and "gpushare:" not in logs["victim"]
