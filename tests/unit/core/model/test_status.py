"""One Status for every check: codes named as the framework names them, bind labels unchanged,
hand-off deferrals told apart by their code, never by their text."""

from __future__ import annotations

from typing import Any

from gpushare.core.booking.changes import NodeTable
from gpushare.core.booking.ledger import Ledger
from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.core.decision.verbs import BIND_OUTCOMES
from gpushare.core.model.inventory import read_node
from gpushare.core.model.requests import PodRequest
from gpushare.core.model.status import SUCCESS, Code, Status, refused
from gpushare.deviceplugin.allocating import refusal
from gpushare.kube.objects import gpu_node


def pod(name: str, mem: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": {
            "containers": [{"name": "c0", "resources": {"limits": {"aliyun.com/gpu-mem": mem}}}]
        },
    }


def test_codes_carry_the_framework_names() -> None:
    assert Code.SUCCESS.value == "Success"
    assert Code.UNSCHEDULABLE.value == "Unschedulable"
    assert Code.UNRESOLVABLE.value == "UnschedulableAndUnresolvable"
    assert Code.WAIT.value == "Wait" and Code.SKIP.value == "Skip" and Code.ERROR.value == "Error"


def test_a_status_says_whether_it_passed_and_why_not_in_one_line() -> None:
    assert SUCCESS.ok and SUCCESS.is_success and SUCCESS.message == ""
    assert Status(Code.SKIP).ok and not Status(Code.SKIP).is_success
    two = Status(Code.UNSCHEDULABLE, ("GPU0: full", "GPU1: unhealthy"), "gpushare")
    assert not two.ok and two.may_pass_later and two.message == "GPU0: full; GPU1: unhealthy"
    assert refused(Code.WAIT, "waiting", "handoff").may_pass_later
    assert not refused(Code.UNRESOLVABLE, "never", "gpushare").may_pass_later


def test_bind_outcomes_keep_their_metric_labels() -> None:
    labels = {code: BIND_OUTCOMES[code].value for code in Code}
    assert labels == {
        Code.SUCCESS: "bound",
        Code.SKIP: "already_bound",
        Code.CONFLICT: "conflict",
        Code.UNSCHEDULABLE: "unfit",
        Code.UNRESOLVABLE: "unfit",
        Code.WAIT: "unfit",
        Code.INVALID: "rejected",
        Code.ERROR: "error",
    }


def test_kubelet_reads_an_allocate_refusal_as_gpushare_said_it() -> None:
    assert (
        refusal(Code.ERROR, "cannot read the pods").attributed == "gpushare: cannot read the pods"
    )


def test_deferrals_are_counted_by_their_code_on_every_way_in() -> None:
    """Node a waits for its device plugin to serve a pod of the same size (a deferral), node b
    has no room: one deferral whether asked by names or by node objects."""
    table = NodeTable()
    for name, gpus in (("a", [4, 15]), ("b", [4])):
        obj = gpu_node(name, gpus_units=gpus)
        obj["metadata"]["annotations"]["gpushare.io/handoff"] = "podresources"
        table[name] = read_node(obj)
    ledger, scheduler = Ledger(), Scheduler(Settings())
    for name in ("a", "b"):
        request = scheduler.read(pod(f"on-{name}", 4))
        assert isinstance(request, PodRequest)
        scheduler.reserve(request, table[name], ledger)
    by_names = scheduler.filter_names(pod("next", 4), ["a", "b"], table, ledger)
    assert set(by_names.failed) == {"a", "b"} and by_names.deferred == 1
    verdicts = scheduler.filter(pod("next", 4), table.values(), ledger).verdicts
    assert [v.code for v in verdicts] == [Code.WAIT, Code.UNSCHEDULABLE]
