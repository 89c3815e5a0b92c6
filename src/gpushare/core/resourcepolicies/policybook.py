"""What the extender knows for ResourcePolicy decisions: policies, placed pods, node labels.

Pure bookkeeping fed by the cache's watches (pods and nodes) and the policy watch. Binds add an
*assumption* for the pod they place before writing anything, with no ``await`` between the
check and the assumption, so two binds cannot both take a unit's last place; the assumption
ends when the watch shows the pod bound, deleted or finished, or when its bind fails. The
annotation patch a bind writes arrives as an unbound pod first, and must not end it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from gpushare.core.booking.ledger import is_terminal
from gpushare.core.model.kubejson import (
    KubeObject,
    annotations_of,
    labels_of,
    meta,
    name_of,
    namespace_of,
    node_name_of,
    uid_of,
    whole_number,
)
from gpushare.core.resourcepolicies.gating import ANN_POLICY, ANN_UNIT, Gate, Placed, decide
from gpushare.core.resourcepolicies.resourcepolicy import (
    InvalidResourcePolicy,
    ResourcePolicy,
    read_policy,
)

Entry = ResourcePolicy | InvalidResourcePolicy


def placed_of(pod: KubeObject, node: str = "") -> Placed:
    """A pod as counting sees it (on ``node`` when given, else where it is bound)."""
    notes = annotations_of(pod)
    unit = notes.get(ANN_UNIT, "")
    return Placed(
        uid=uid_of(pod),
        namespace=namespace_of(pod),
        labels=dict(labels_of(pod)),
        node=node or node_name_of(pod),
        created=str(meta(pod).get("creationTimestamp") or ""),
        terminating=bool(meta(pod).get("deletionTimestamp")),
        policy=notes.get(ANN_POLICY, ""),
        unit=whole_number(unit) or 0,
    )


def placing_of(pod: KubeObject) -> tuple[str, Placed | None, bool]:
    """A pod's UID, how counting sees it (None unless bound and unfinished), and whether it
    finished: what ``PolicyBook.take_pod`` takes."""
    terminal = is_terminal(pod)
    placed = None if terminal or not node_name_of(pod) else placed_of(pod)
    return uid_of(pod), placed, terminal


def recorded_units(pods: Iterable[KubeObject]) -> dict[str, tuple[str, int]]:
    """Per pod UID, the policy name and unit number its bind recorded (pods with both only)."""
    found = {}
    for pod in pods:
        placed = placed_of(pod)
        if placed.policy and placed.unit:
            found[placed.uid] = (placed.policy, placed.unit)
    return found


class PolicyBook:
    """Policies by namespace, bound pods by namespace and UID, node labels by name, bind
    assumptions.

    Bound pods are kept per namespace because a policy counts only its own namespace's pods:
    a decision then costs the pods of that namespace, not every pod of the cluster.
    """

    def __init__(self) -> None:
        self._policies: dict[str, dict[str, Entry]] = {}
        self._pods: dict[str, dict[str, Placed]] = {}
        """namespace -> UID -> pod."""
        self._namespace_of: dict[str, str] = {}
        self._assumed: dict[str, Placed] = {}
        self.node_labels: dict[str, Mapping[str, str]] = {}

    # policies
    def put_policy(self, obj: KubeObject) -> Entry:
        """Take in a created or changed policy; return it as read."""
        entry = read_policy(obj)
        self._policies.setdefault(namespace_of(obj), {})[name_of(obj)] = entry
        return entry

    def delete_policy(self, namespace: str, name: str) -> None:
        """Forget a deleted policy."""
        self._policies.get(namespace, {}).pop(name, None)

    def replace_policies(self, objs: Iterable[KubeObject]) -> None:
        """Start over from a full list."""
        self._policies = {}
        for obj in objs:
            self.put_policy(obj)

    def entries(self) -> list[Entry]:
        """Every policy as read, valid or not, by namespace then name."""
        return [
            self._policies[ns][n]
            for ns in sorted(self._policies)
            for n in sorted(self._policies[ns])
        ]

    def policy_for(self, namespace: str, labels: Mapping[str, str]) -> Entry | None:
        """The policy that orders a pod: of those selecting it, the first by name."""
        for name in sorted(self._policies.get(namespace, {})):
            entry = self._policies[namespace][name]
            selector = entry.selector
            if selector and all(labels.get(k) == v for k, v in selector.items()):
                return entry
        return None

    # pods
    def observe_pod(self, pod: KubeObject) -> None:
        """Take in a pod as the watch or a list shows it."""
        uid, placed, terminal = placing_of(pod)
        self.take_pod(uid, placed, terminal=terminal)

    def take_pod(self, uid: str, placed: Placed | None, *, terminal: bool) -> None:
        """Take in what ``placing_of`` read of a pod (the cache reads a relist's pods before it
        takes them in all at once)."""
        if placed is None:
            self._drop(uid)
            if terminal:
                self._assumed.pop(uid, None)
            return
        self._drop(uid)
        self._pods.setdefault(placed.namespace, {})[uid] = placed
        self._namespace_of[uid] = placed.namespace
        self._assumed.pop(uid, None)

    def _drop(self, uid: str) -> None:
        namespace = self._namespace_of.pop(uid, None)
        if namespace is None:
            return
        pods = self._pods[namespace]
        pods.pop(uid, None)
        if not pods:
            del self._pods[namespace]

    def forget_pod(self, uid: str) -> None:
        """Forget a deleted pod."""
        self._drop(uid)
        self._assumed.pop(uid, None)

    def retain_pods(self, uids: set[str]) -> None:
        """After a relist, keep only the pods that still exist."""
        for uid in [u for u in self._namespace_of if u not in uids]:
            self._drop(uid)
        self._assumed = {u: p for u, p in self._assumed.items() if u in uids}

    def assume(self, placed: Placed) -> None:
        """Count a pod a bind is placing, until the watch shows it bound."""
        self._assumed[placed.uid] = placed

    def unassume(self, uid: str) -> None:
        """Drop a bind's assumption (the bind failed)."""
        self._assumed.pop(uid, None)

    def placed(self, namespace: str | None = None) -> list[Placed]:
        """The pods counting sees (of ``namespace``, or all): bound ones, then assumed ones not
        yet seen bound."""
        if namespace is None:
            bound = [p for pods in self._pods.values() for p in pods.values()]
        else:
            bound = list(self._pods.get(namespace, {}).values())
        assumed = (
            p
            for u, p in self._assumed.items()
            if u not in self._namespace_of and namespace in (None, p.namespace)
        )
        return [*bound, *assumed]

    def recorded_units(self) -> dict[str, tuple[str, int]]:
        """Per pod UID, the policy and unit its bind recorded, or is recording (assumed)."""
        return {p.uid: (p.policy, p.unit) for p in self.placed() if p.policy and p.unit}

    # nodes
    def observe_node(self, node: KubeObject) -> None:
        """Take in a node's labels."""
        self.node_labels[name_of(node)] = dict(labels_of(node))

    def forget_node(self, name: str) -> None:
        """Forget a deleted node."""
        self.node_labels.pop(name, None)

    def replace_nodes(self, nodes: Iterable[KubeObject]) -> None:
        """Start over from a full list."""
        self.replace_node_labels({name_of(n): dict(labels_of(n)) for n in nodes})

    def replace_node_labels(self, labels: dict[str, Mapping[str, str]]) -> None:
        """Start over from a full list's labels by node name (the cache reads them off the
        node objects before it lists the pods, and lets the objects go)."""
        self.node_labels = labels

    # deciding
    def gate(
        self, pod: KubeObject, *, fitting: list[str], now_s: float, node: str = ""
    ) -> Gate | None:
        """The decision for ``pod`` (None: no policy orders it)."""
        namespace, labels = namespace_of(pod), labels_of(pod)
        entry = self.policy_for(namespace, labels)
        if entry is None:
            return None
        if isinstance(entry, InvalidResourcePolicy):
            return Gate(entry.key, None, (), "", error=entry.message)
        return decide(
            entry,
            uid=uid_of(pod),
            labels=labels,
            created=str(meta(pod).get("creationTimestamp") or ""),
            placed=self.placed(namespace),
            node_labels=self.node_labels,
            fitting=fitting,
            now_s=now_s,
        )

    def placement(self, pod: KubeObject, node: str, gate: Gate) -> Placed:
        """The assumption for ``pod`` placed on ``node`` in the gate's unit."""
        unit = gate.chosen.number if gate.chosen is not None else 0
        name = gate.policy.split("/", 1)[1]
        return replace(placed_of(pod, node), policy=name, unit=unit)
