"""``kubectl inspect cgpu --explain`` through the Kubernetes port and the command line."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpushare.core.autoscaling.placeholders import PlaceholderSettings, manifest
from gpushare.core.decision.scheduling import Settings
from gpushare.core.records.trust import Trust
from gpushare.inspect.cli import PodNotFound, Query, _explain, collect_explanation, render_explained
from gpushare.inspect.cli import main as inspect_cgpu
from tests.support.kubeconfigs import KUBECONFIG, kube_with_pods


def test_explain_a_pending_pod_through_the_port() -> None:
    kube = kube_with_pods()
    big = asyncio.run(collect_explanation(kube, "ml", "big", settings=Settings()))
    text = render_explained(big, output="text")
    assert "POD:      ml/big (Pending)" in text
    assert "node-a  no" not in text  # 15 GiB GPUs: never, not "once freed"
    assert (
        "0/2 nodes in the cluster pass gpushare's checks: "
        "1 × GPU0: 15 GiB total < 20 GiB requested" in text
    )
    small = asyncio.run(collect_explanation(kube, "ml", "small", settings=Settings()))
    data = json.loads(render_explained(small, output="json"))
    assert [n["fits"] for n in data["nodes"]] == ["yes", "yes"]
    assert data["nodes"][0]["placement"] == "GPU0 on node-a, 3/15 GiB"


def test_explain_an_unknown_pod() -> None:
    with pytest.raises(PodNotFound, match="pod ml/ghost not found"):
        asyncio.run(collect_explanation(kube_with_pods(), "ml", "ghost", settings=Settings()))


def test_explain_flags(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(KUBECONFIG)
    runner = CliRunner()
    bad = runner.invoke(inspect_cgpu, ["-e", "ml/", "--kubeconfig", str(config)])
    assert bad.exit_code == 2 and "NAMESPACE/POD" in bad.output
    policy = runner.invoke(inspect_cgpu, ["-e", "p", "--policy", "nope"])
    assert policy.exit_code == 2 and "nope" in policy.output
    down = runner.invoke(inspect_cgpu, ["-e", "p", "-n", "ml", "--kubeconfig", str(config)])
    assert down.exit_code == 1 and "cannot read from the Kubernetes API" in down.output


def test_explain_names_the_placeholder_that_asks_for_a_new_node() -> None:
    """The installed extender's --placeholder-namespace is read from its Deployment, and the
    placeholder there that stands for the pod is named (not the other pods it stands for)."""
    kube = kube_with_pods()
    pods, _ = asyncio.run(kube.list_pods(namespace="ml"))
    big = next(p for p in pods if p["metadata"]["name"] == "big")
    body = manifest(
        big,
        name="gpushare-placeholder-feedc0ffee00",
        covers=[big["metadata"]["uid"], "other-uid"],
        keys=["ml/big", "team-b/hidden"],
        gpus=2,
        gpu_mib=15360,
        node_names=["node-a", "node-b"],
        settings=PlaceholderSettings(namespace="gpushare"),
    )
    kube.create_pod(body)
    containers = [{"name": "extender", "args": ["extender", "--placeholder-namespace=gpushare"]}]
    kube.put_deployment(
        {
            "metadata": {"namespace": "gpushare", "name": "gpushare-scheduler"},
            "spec": {"template": {"spec": {"containers": containers}}},
        }
    )
    notes: list[str] = []
    query = Query(explain=("ml", "big"))
    explained = asyncio.run(_explain(kube, query, Trust.structural(), notes, home="ml"))
    text = render_explained(explained, output="text")
    assert (
        "NEW NODE: waits for a new node: placeholder gpushare-placeholder-feedc0ffee00 asks the "
        "autoscaler for one (2 GPU(s) of 15 GiB)" in text
    )
    assert "team-b" not in text and "hidden" not in text
    small = asyncio.run(
        _explain(kube, Query(explain=("ml", "small")), Trust.structural(), [], home="ml")
    )
    assert small.new_node == ""  # it fits
