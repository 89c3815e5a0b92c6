"""Trust: seals, the judgement of each allocation, strangers, and counting each pod once."""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import hmac
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.core.booking.ledger import Ledger
from gpushare.core.model.names import ANN_ALLOCATION, ANN_SEAL, DEFAULT_NAMES
from gpushare.core.model.requests import PodRequest, read_pod
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.allocation import plan, to_annotations
from gpushare.core.records.handoff import CORE, MEM, pending_of, resolve
from gpushare.core.records.trust import (
    TRUSTED,
    IgnoredOnce,
    NodeJudge,
    Reason,
    SealKey,
    Trust,
    device_counts,
    has_started,
    read_key,
    seal,
    seal_matches,
    sort_node_pods,
)
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_pod, placed
from gpushare.kube.sealing import keyless_trust, secret_key

KEY = SealKey(b"trust-test-key-0123456789abcdefg")
TRUST = Trust.sealed(KEY)


def sealed_pod(name: str, mem: int, *, node: str = "n", index: int = 0, bound: bool = True) -> Any:
    pod = gpu_pod(name, mem=mem)
    pod["metadata"]["uid"] = f"uid-{name}"
    request = read_pod(pod)
    assert isinstance(request, PodRequest)
    allocation = plan(request, node=node, indexes=[index], unit=MemoryUnit.GiB)
    return placed(pod, allocation, trust=TRUST, bound=bound)


def forged(pod: dict[str, Any], *, node: str, gpus: list[tuple[int, int]]) -> dict[str, Any]:
    """Annotations a tenant writes by hand, as gpushare would spell them."""
    record = {
        "version": 1,
        "node": node,
        "unit": "1GiB",
        "gpus": [{"index": i, "mem": m, "core": 0} for i, m in gpus],
        "containers": [
            {"name": "main", "kind": "app", "gpus": [{"index": i, "mem": m, "core": 0}]}
            for i, m in gpus
        ][:1],
    }
    out = copy.deepcopy(pod)
    out["metadata"].setdefault("uid", f"uid-{out['metadata']['name']}")
    out["metadata"]["annotations"] = {ANN_ALLOCATION: json.dumps(record)}
    return out


def judge(pod: dict[str, Any], trust: Trust = TRUST) -> Any:
    from gpushare.core.records.allocation import from_pod

    allocation = from_pod(pod)
    assert allocation is not None
    return trust.judge(pod, allocation)


def test_seal_is_hmac_sha256_of_a_versioned_json_array_in_base64url() -> None:
    fields = {"uid": "u", "namespace": "ns", "name": "p", "node": "n", "record": '{"a":1}'}
    message = b'["gpushare.io/seal",1,"u","ns","p","n","{\\"a\\":1}"]'
    digest = hmac.new(KEY.secret, message, hashlib.sha256).digest()
    expected = "v1." + base64.urlsafe_b64encode(digest).decode().rstrip("=")
    assert seal(KEY, **fields) == expected
    assert seal_matches(KEY, expected, **fields)
    assert "trust-test-key" not in repr(KEY)


def test_a_sealed_allocation_counts_bound_or_not() -> None:
    assert judge(sealed_pod("a", 3)) == TRUSTED
    assert judge(sealed_pod("a", 3, bound=False)) == TRUSTED  # between annotate and bind


def test_finding_1_a_forged_allocation_on_a_pod_asking_for_no_gpu_counts_nowhere() -> None:
    """A pod asking for nothing, never scheduled, naming node X GPU0 and GPU1 at 15 GiB each."""
    pod = gpu_pod("squatter", mem=None, scheduler="nobody")
    bogus = forged(pod, node="x", gpus=[(0, 15), (1, 15)])
    assert judge(bogus).reason is Reason.NO_SEAL
    ledger = Ledger.from_pods([bogus], trust=TRUST)
    assert ledger.usage("x").mem_units == 0 and ledger.nodes() == set()
    (ignored,) = ledger.ignored()
    assert (ignored.name, ignored.node, ignored.why.message) == ("squatter", "x", "no seal")
    structural = judge(bogus, Trust.structural())
    assert structural.reason is Reason.REQUESTS
    assert "the pod asks for no aliyun.com/gpu-mem" in structural.message


def test_a_seal_copied_to_another_pod_does_not_match() -> None:
    original = sealed_pod("a", 3)
    copied = sealed_pod("b", 3)
    copied["metadata"]["annotations"] = dict(original["metadata"]["annotations"])
    assert judge(copied).reason is Reason.SEAL_MISMATCH
    recreated = copy.deepcopy(original)
    recreated["metadata"]["uid"] = "uid-a-second"  # same name, a new pod
    assert judge(recreated).message == "seal does not match"


def test_a_sealed_allocation_on_a_pod_bound_elsewhere_is_ignored() -> None:
    pod = sealed_pod("a", 3, node="x")
    pod["spec"]["nodeName"] = "y"
    verdict = judge(pod)
    assert verdict.reason is Reason.WRONG_NODE
    assert verdict.message == "bound to node y, allocation names x"
    usage = Ledger.from_pods([pod], trust=TRUST).usage("y")
    assert usage.gpus == {} and usage.unplaced_mem_units == 3


def test_structure_only_refuses_a_record_larger_than_its_pod() -> None:
    pod = forged(gpu_pod("small", mem=1), node="x", gpus=[(0, 8)])
    pod["spec"]["nodeName"] = "x"
    verdict = judge(pod, Trust.structural())
    assert verdict.reason is Reason.REQUESTS
    assert verdict.message.startswith("allocation does not match the pod's requests: ")
    assert "GPU0:1" in verdict.message and "GPU0:8" in verdict.message
    assert judge(forged(gpu_pod("ok", mem=8), node="x", gpus=[(0, 8)]), Trust.structural()) == (
        TRUSTED
    )


def test_a_trust_without_a_key_trusts_nothing() -> None:
    verdict = judge(sealed_pod("a", 3), Trust())
    assert verdict.reason is Reason.NO_KEY


def test_keys_shorter_than_16_bytes_are_refused_and_whitespace_is_dropped() -> None:
    assert isinstance(read_key(b"short\n", where="f"), str)
    assert read_key(b"0123456789abcdef\n", where="f") == SealKey(b"0123456789abcdef")
    message = read_key(b"", where="seal key file k")
    assert isinstance(message, str) and "gpushare seal-key" in message


TAMPERS = ["uid", "namespace", "name", "node", "record"]


@settings(max_examples=300, deadline=None)
@given(
    field=st.sampled_from(TAMPERS),
    original=st.fixed_dictionaries({f: st.text(max_size=40) for f in TAMPERS}),
    replacement=st.text(max_size=40),
)
def test_a_tampered_field_never_verifies(
    field: str, original: dict[str, str], replacement: str
) -> None:
    made = seal(KEY, **original)
    changed = {**original, field: replacement}
    assert seal_matches(KEY, made, **changed) == (replacement == original[field])


@settings(max_examples=200, deadline=None)
@given(mem=st.integers(1, 15), other_mem=st.integers(1, 15), index=st.integers(0, 3))
def test_a_tampered_record_uid_or_node_on_a_pod_is_never_trusted(
    mem: int, other_mem: int, index: int
) -> None:
    pod = sealed_pod("p", mem)
    assert judge(pod) == TRUSTED
    edited = copy.deepcopy(pod)
    record = json.loads(edited["metadata"]["annotations"][ANN_ALLOCATION])
    record["gpus"][0]["index"] = index
    record["containers"][0]["gpus"][0]["mem"] = other_mem
    edited["metadata"]["annotations"][ANN_ALLOCATION] = json.dumps(record, separators=(",", ":"))
    same = index == 0 and other_mem == mem
    assert (judge(edited) == TRUSTED) == same
    moved = copy.deepcopy(pod)
    moved["metadata"]["uid"] = f"uid-other-{index}"
    assert judge(moved) != TRUSTED
    elsewhere = sealed_pod("p", mem, node=f"node-{index}")
    elsewhere["metadata"]["annotations"][ANN_SEAL] = pod["metadata"]["annotations"][ANN_SEAL]
    assert judge(elsewhere) != TRUSTED


def test_device_counts_follow_kubelet_even_for_requests_gpushare_refuses() -> None:
    pod = gpu_pod("odd", mem=5, core=7)  # 7 % is refused by read_pod, not by kubelet
    assert device_counts(pod) == {(MEM, 5), (CORE, 7)}
    assert device_counts(gpu_pod("none", mem=None)) == frozenset()


def test_a_pod_has_started_once_kubelet_reports_a_container_or_a_phase() -> None:
    pod = gpu_pod("p", mem=1)
    assert not has_started(pod)
    assert not has_started({**pod, "status": {"phase": "Pending"}})
    assert has_started({**pod, "status": {"phase": "Running"}})
    assert has_started({**pod, "status": {"phase": "Pending", "containerStatuses": [{}]}})


def stranger_pod(name: str, mem: int, node: str = "n", **status: Any) -> dict[str, Any]:
    pod = gpu_pod(name, mem=mem, scheduler="nobody")
    pod["metadata"]["uid"] = f"uid-{name}"
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Pending", **status}
    return pod


def test_node_pods_split_into_trusted_strangers_and_ignored() -> None:
    genuine = sealed_pod("genuine", 5)
    bare = stranger_pod("bare", 5)
    bogus = forged(stranger_pod("bogus", 8), node="n", gpus=[(0, 8)])
    running = stranger_pod("running", 3, phase="Running")
    elsewhere = stranger_pod("elsewhere", 2, node="m")
    done = {**sealed_pod("done", 4), "status": {"phase": "Succeeded"}}
    pods = sort_node_pods([genuine, bare, bogus, running, elsewhere, done], node="n", trust=TRUST)
    assert [a.name for a in pods.allocations] == ["genuine"]
    assert [(s.pod, s.counts) for s in pods.strangers] == [
        ("default/bare", {(MEM, 5)}),
        ("default/bogus", {(MEM, 8)}),
    ]
    assert pods.strangers[0].reason == "it carries no gpushare allocation"
    assert pods.strangers[1].reason == "its allocation is ignored: no seal"
    assert [(p["metadata"]["name"], why.reason) for p, why in pods.ignored] == [
        ("bogus", Reason.NO_SEAL)
    ]


def test_a_node_judge_reads_in_one_call_and_reports_each_ignored_pod_once_per_reason() -> None:
    """The device plugin's read of its node: pods judged, by UID, the finished ones, and the
    ignored allocations to count, each pod once per reason however often it is read again."""
    genuine = sealed_pod("genuine", 5)
    bogus = forged(stranger_pod("bogus", 8), node="n", gpus=[(0, 8)])
    done = {**sealed_pod("done", 4), "status": {"phase": "Succeeded"}}
    judge = NodeJudge(TRUST, DEFAULT_NAMES, node="n")
    first = judge.read([genuine, bogus, done])
    assert [a.name for a in first.pods.allocations] == ["genuine"]
    assert set(first.by_uid) == {"uid-genuine", "uid-bogus", "uid-done"}
    assert first.finished == {"uid-done"}
    assert [(p["metadata"]["name"], why.reason) for p, why in first.reports] == [
        ("bogus", Reason.NO_SEAL)
    ]
    assert judge.read([genuine, bogus]).reports == ()  # seen, not news
    assert judge.read([genuine]).reports == ()  # gone: forgotten
    again = judge.read([genuine, bogus])
    assert [p["metadata"]["name"] for p, _ in again.reports] == ["bogus"]


def test_finding_3_a_stranger_of_the_same_count_makes_allocate_refuse() -> None:
    genuine = sealed_pod("genuine", 5)
    stranger = stranger_pod("intruder", 5)
    pods = sort_node_pods([genuine, stranger], node="n", trust=TRUST)
    answer = resolve(MEM, 5, pending_of(pods.allocations), pods.strangers)
    assert answer.signature is None
    assert "pod default/intruder (it carries no gpushare allocation)" in answer.status.message
    assert "default/genuine" in answer.status.message
    other_count = resolve(MEM, 3, pending_of(pods.allocations), pods.strangers)
    assert other_count.signature is None and "no pod bound" in other_count.status.message
    alone = sort_node_pods([stranger], node="n", trust=TRUST)
    refused = resolve(MEM, 5, [], alone.strangers)
    assert refused.signature is None and "was not placed by gpushare" in refused.status.message
    only_genuine = sort_node_pods([genuine], node="n", trust=TRUST)
    served = resolve(MEM, 5, pending_of(only_genuine.allocations))
    assert served.signature is not None


def test_each_pod_is_reported_once_per_reason_and_told_once() -> None:
    once = IgnoredOnce()
    first = once.note("a", Reason.NO_SEAL)
    assert first.count and first.tell
    again = once.note("a", Reason.NO_SEAL)
    assert not again.count and not again.tell
    other = once.note("a", Reason.WRONG_NODE)
    assert other.count and not other.tell
    once.retain(["b"])
    assert once.note("a", Reason.NO_SEAL).tell
    once.forget("a")
    assert once.note("a", Reason.NO_SEAL).tell


def test_to_annotations_is_what_the_seal_covers() -> None:
    pod = sealed_pod("a", 3)
    annotations = pod["metadata"]["annotations"]
    request = read_pod(pod)
    assert isinstance(request, PodRequest)
    allocation = plan(request, node="n", indexes=[0], unit=MemoryUnit.GiB)
    assert annotations[ANN_ALLOCATION] == to_annotations(allocation, dev_units=15)[ANN_ALLOCATION]
    assert annotations[ANN_SEAL] == TRUST.seal_for(allocation, annotations[ANN_ALLOCATION])


class CountingTrust(Trust):
    calls = 0

    def judge(self, pod: Any, allocation: Any, **kwargs: Any) -> Any:
        CountingTrust.calls += 1
        return super().judge(pod, allocation, **kwargs)


def test_a_pod_is_judged_once_until_what_the_judgement_reads_changes() -> None:
    """Status changes and relists do not verify a seal again; a new record or node does."""
    trust = CountingTrust(key=KEY)
    ledger = Ledger(trust=trust)
    pod = sealed_pod("a", 3)
    ledger.observe(pod)
    ledger.observe({**pod, "status": {"phase": "Running"}})
    relisted = Ledger(judged=ledger.judged)
    relisted.observe(pod)
    assert CountingTrust.calls == 1 and relisted.usage("n").mem_units == 3
    moved = copy.deepcopy(pod)
    moved["spec"]["nodeName"] = "elsewhere"
    assert relisted.observe(moved) is not None and CountingTrust.calls == 2
    relisted.forget("uid-a")
    relisted.observe(pod)
    assert CountingTrust.calls == 3


def test_the_in_memory_cluster_and_its_secret_are_one_key_whatever_its_bytes() -> None:
    """Every reader drops surrounding whitespace; the in-memory cluster's own components too.

    Raw random bytes that began with a newline once made the demo's inspect (reading the
    Secret) and its extender (reading the key directly) disagree on every seal.
    """
    for raw in (b"\n" + b"k" * 31, b"k" * 31 + b" ", None):
        kube = MemoryKube(seal_key=raw)
        from_secret = asyncio.run(secret_key(kube, "gpushare", "gpushare-seal"))
        assert not isinstance(from_secret, str)
        assert keyless_trust(kube) == Trust.sealed(from_secret)
    made = MemoryKube().seal_key
    assert made.strip() == made and len(made) == 64
