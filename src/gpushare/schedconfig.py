"""The KubeSchedulerConfiguration that wires kube-scheduler to the gpushare extender.

Extenders are global in a KubeSchedulerConfiguration: every profile calls them, but only for
pods that ask for one of ``managedResources``. So the ``ack-co-scheduler`` profile the seeds name
and the default profile both place GPU-sharing pods through gpushare, and plain pods never reach
the extender. The extender binds GPU pods itself (``bindVerb``), writing the annotations first.
"""

from __future__ import annotations

from typing import Any

import yaml

from gpushare.core.model.names import DEFAULT_NAMES, SCHEDULER_NAME, ResourceNames

EXTENDER_WEIGHT = 5
"""Extender scores are 0..10 and kube-scheduler multiplies by weight x 10 (``prioritizeNodes`` in
k8s.io/kubernetes pkg/scheduler/schedule_one.go): the extender's single top node leads the next
by one point, 50 after the weight. In the ``ack-co-scheduler`` profile no generic score differs
between two plain nodes, so that lead decides; in the default profile it outweighs any one
generic score plugin's usual differences (100 times its weight at most)."""

PERCENTAGE_OF_NODES_TO_SCORE = 100
"""Feasible nodes kube-scheduler looks for before it scores, in percent of all nodes (the
default; ``scheduler.percentageOfNodesToScore`` in the chart, ``--percentage-of-nodes-to-score``
here).

Left at 0, kube-scheduler stops filtering once it has found ``max(100, n x (50 - n/125) %)``
feasible nodes (at least 5 %), starting where the previous pod stopped
(``numFeasibleNodesToFind`` and ``nextStartNodeIndex`` in pkg/scheduler/schedule_one.go): on
1,213 nodes the extender would rank a rotating 41 % of them, and the best GPU for a pod is
often in the other 59 %. Packing is a choice over every node, so the GPU profile asks for all;
the extender answers over names (``nodeCacheCapable``) from views that follow changes, so a
full list costs it little (``make bench``, ``extender_http_speed.py --names all``).

kube-scheduler's own filters then run over every node for every pod, which is most of what a
GPU pod costs it beyond a plain one: past a few thousand nodes a lower value trades packing for
pods per second (``benchmarks/throughput.py --percentage``; the numbers are in
docs/benchmarks.md, "Throughput on the real control plane"). 0 is kube-scheduler's adaptive
default."""


def check_percentage(value: int) -> int:
    """``percentageOfNodesToScore`` as kube-scheduler accepts it, or a ValueError saying why."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 100:
        raise ValueError(
            f"percentageOfNodesToScore={value!r} must be an integer from 0 to 100 (100: score "
            f"every feasible node, the packing default; 0: kube-scheduler's adaptive sample)"
        )
    return value


IGNORED_BY_SCHEDULER = True
"""kube-scheduler leaves gpushare's resources to the extender (``managedResources``).

Left to NodeResourcesFit, a pod asking for more ``aliyun.com/gpu-mem`` than a node's total, or
writing a byte size such as ``3Gi`` (3 x 2^30 units), is refused on every node by that plugin
before any extender is called (``findNodesThatPassExtenders`` in
pkg/scheduler/schedule_one.go runs only over the nodes the plugins kept), so ``kubectl
describe pod`` says only ``Insufficient aliyun.com/gpu-mem``. With the resources ignored by the
plugins (kube-scheduler copies them into NodeResourcesFit's ``ignoredResources``, see
``buildExtenders`` in pkg/scheduler/scheduler.go) the extender judges every node the other
plugins kept, and kube-scheduler counts the extender's per-node messages into the pod's
FailedScheduling event (``FitError.Error`` in pkg/scheduler/framework/types.go): ``0/2 nodes
are available: 1 GPU0: 15 GiB total < 16 GiB requested, 1 node(s) had untolerated taint``.
Nothing is lost: the extender already checks each GPU against the ledger, which is stricter
than NodeResourcesFit's node totals, and kubelet still admits pods against the node's
allocatable."""

NO_GENERIC_SCORES = ("NodeResourcesFit", "NodeResourcesBalancedAllocation", "ImageLocality")
"""Score plugins the GPU profile turns off (their filters stay): they rank nodes by how full or
even their CPU and memory are and by which images they hold, and any of them (up to 100 points,
weight 1) can overturn the extender's 50-point lead (see ``packing_profile``)."""


def packing_profile(
    scheduler_name: str, percentage: int = PERCENTAGE_OF_NODES_TO_SCORE
) -> dict[str, Any]:
    """The GPU-sharing profile: the extender's choice of node is the one kube-scheduler takes.

    kube-scheduler adds its score plugins' totals to the extender's and takes the best total,
    at random among equals (``prioritizeNodes``, ``selectHost`` in
    pkg/scheduler/schedule_one.go); the extender leads with one node by 50 points
    (``EXTENDER_WEIGHT``). The defaults would overturn it: NodeResourcesFit's LeastAllocated and
    NodeResourcesBalancedAllocation (up to 100 each) prefer emptier and evener nodes,
    ImageLocality (up to 100) nodes that hold the image, and PodTopologySpread's system default
    constraints (weight 2) spread the pods of one Deployment, ReplicaSet or StatefulSet across
    hostnames. Scoring CPU and memory with MostAllocated instead still moves a pod to a node
    whose CPU is fuller by more than half, away from the GPU the policy chose. So this profile
    keeps those plugins' filters (CPU, memory, pods and extended resources still have to fit)
    and drops their scores (``NO_GENERIC_SCORES``), and adds no spreading to pods that did not
    ask for it. What is left scores only what a pod or node states itself: preferred node
    affinity, pod (anti-)affinity, topology spread constraints the pod writes, PreferNoSchedule
    taints; between nodes that state nothing they are equal, so the extender's top node wins.
    It also scores every feasible node, unless ``percentage`` says otherwise
    (``PERCENTAGE_OF_NODES_TO_SCORE``). The default profile keeps kube-scheduler's defaults:
    plain pods schedule as they always did.
    """
    return {
        "schedulerName": scheduler_name,
        "percentageOfNodesToScore": check_percentage(percentage),
        "plugins": {"score": {"disabled": [{"name": name} for name in NO_GENERIC_SCORES]}},
        "pluginConfig": [
            {
                "name": "PodTopologySpread",
                "args": {"defaultingType": "List", "defaultConstraints": []},
            },
        ],
    }


def scheduler_configuration(
    *,
    url: str = "http://127.0.0.1:32766",
    kubeconfig: str | None = "/etc/kubernetes/scheduler.conf",
    leader_elect: bool = True,
    names: ResourceNames = DEFAULT_NAMES,
    default_profile: bool = True,
    http_timeout: str = "5s",
    scheduler_name: str = SCHEDULER_NAME,
    lease: tuple[str, str] | None = None,
    percentage: int = PERCENTAGE_OF_NODES_TO_SCORE,
) -> dict[str, Any]:
    """The configuration as a dict; ``lease`` is the (namespace, name) of the leader Lease."""
    election: dict[str, Any] = {"leaderElect": leader_elect}
    if leader_elect and lease is not None:
        namespace, name = lease
        election.update(resourceLock="leases", resourceNamespace=namespace, resourceName=name)
    config: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": election,
        "profiles": ([{"schedulerName": "default-scheduler"}] if default_profile else [])
        + [packing_profile(scheduler_name, percentage)],
        "extenders": [
            {
                "urlPrefix": url,
                "filterVerb": "filter",
                "prioritizeVerb": "prioritize",
                "bindVerb": "bind",
                "weight": EXTENDER_WEIGHT,
                "enableHTTPS": False,
                "nodeCacheCapable": True,
                "httpTimeout": http_timeout,
                "ignorable": False,
                "managedResources": [
                    {"name": names.mem, "ignoredByScheduler": IGNORED_BY_SCHEDULER},
                    {"name": names.core, "ignoredByScheduler": IGNORED_BY_SCHEDULER},
                ],
            }
        ],
    }
    if kubeconfig:
        config["clientConnection"] = {"kubeconfig": kubeconfig}
    return config


def render_yaml(config: dict[str, Any]) -> str:
    """YAML text with a header that says where it comes from."""
    header = "# Generated by `gpushare scheduler-config`; see gpushare/schedconfig.py for why.\n"
    return header + yaml.safe_dump(config, sort_keys=False)
