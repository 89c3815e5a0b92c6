"""``--explain`` says whether a pod no node fits waits for a new node (``inspect.newnode``).

The autoscalers judge ``aliyun.com/gpu-mem`` by node totals and never ask an extender
(../shared/docs/AUTOSCALERS.md 1a: cluster-autoscaler's ``simulator/framework/handle.go``; 1c:
Karpenter's ``pkg/utils/resources`` ``Fits``), so only a gpushare placeholder brings a node
for a pod that no single GPU holds; the explanation names it, and only it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from gpushare.core.autoscaling.placeholders import PlaceholderSettings, manifest
from gpushare.core.decision.clusterstate import ClusterState
from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.core.records.trust import Trust
from gpushare.inspect.explain import explain_pod, explanation_json
from gpushare.inspect.newnode import PlaceholderSight
from gpushare.inspect.render import render_explanation
from gpushare.kube.objects import gpu_pod
from tests.support.inspecting import explain

ON = PlaceholderSight(namespace="gpushare")


def placeholder(
    covers: list[str], keys: list[str], *, gpus: int = 1, namespace: str = "gpushare"
) -> dict[str, Any]:
    """A placeholder pod as the extender writes it (``core.autoscaling.placeholders``)."""
    owner = gpu_pod("train", mem=14, namespace="team-a")
    body = manifest(
        owner,
        name="gpushare-placeholder-0123456789ab",
        covers=covers,
        keys=keys,
        gpus=gpus,
        gpu_mib=16384,
        node_names=["node-a", "node-b", "node-c", "node-x"],
        settings=PlaceholderSettings(namespace=namespace),
    )
    body["metadata"]["uid"] = "ph-" + "-".join(covers)
    body["status"] = {"phase": "Pending"}
    return body


def test_a_pod_a_placeholder_stands_for_waits_for_a_new_node(
    golden: Callable[[str, str], None],
) -> None:
    other_tenant = gpu_pod("secret-job", mem=2, namespace="team-b")
    other_tenant["metadata"]["uid"] = "o"
    held = placeholder(["o", "t"], ["team-b/secret-job", "team-a/train"])
    e = explain(14, sight=ON, pods=[other_tenant, held])
    assert e.new_node == (
        "waits for a new node: placeholder gpushare-placeholder-0123456789ab asks the "
        "autoscaler for one (1 GPU(s) of 16 GiB)"
    )
    text = render_explanation(e)
    golden("explain_new_node.txt", text)
    # the placeholder also stands for another tenant's pod: its name is not told
    document = json.dumps(explanation_json(e))
    assert "secret-job" not in text and "team-b" not in text and "secret-job" not in document
    assert json.loads(document)["newNode"] == e.new_node


def test_a_placeholder_elsewhere_or_for_other_pods_is_not_this_pods() -> None:
    foreign = placeholder(["t"], ["team-a/train"], namespace="team-a")  # not the extender's
    others = placeholder(["o"], ["team-b/secret-job"])
    e = explain(14, sight=ON, pods=[foreign, others])
    assert e.new_node.startswith("no placeholder stands for it yet: the installed extender keeps")
    assert "namespace gpushare" in e.new_node and "autoscaling.maxPlaceholders" in e.new_node


def test_placeholders_off_or_unknown_say_so() -> None:
    off = explain(14, sight=PlaceholderSight(namespace=""))
    assert off.new_node.startswith("no new node is asked for: the installed extender keeps no ")
    assert "autoscaling.placeholders" in off.new_node
    unknown = explain(14, sight=PlaceholderSight(namespace="gpushare", known=False))
    assert "whether the installed extender keeps placeholders is unknown" in unknown.new_node


def test_nothing_is_said_when_a_node_fits_or_nothing_is_known() -> None:
    assert explain(10, sight=ON).new_node == ""  # fits node-a and node-b
    assert explain(14).new_node == ""  # placeholders not looked at
    assert "NEW NODE:" not in render_explanation(explain(14))
    assert explain(2, core=33, sight=ON).new_node == ""  # invalid: no placeholder is made


def test_explaining_a_placeholder_itself_counts_its_pods_without_naming_them() -> None:
    held = placeholder(["o", "t"], ["team-b/secret-job", "team-a/train"], gpus=2)
    state = ClusterState.listed(settings=Settings(), trust=Trust(), nodes=[], pods=[held])
    e = explain_pod(held, state, Scheduler(), placeholders=ON.seeing([held]))
    assert e.new_node.startswith(
        "this is a gpushare placeholder: it stands for 2 pod(s) no existing GPU holds"
    )
    assert "(2 GPU(s) of 16 GiB)" in e.new_node and "secret-job" not in e.new_node
