"""The decision cache: every node's current decision per request key, for every way in.

A decision (verdict and score, ``core.decision.decider``) depends only on the node's inventory,
what is
held there, the request's key and the policy's version, not on which pod asks. Pods come in few
keys and a bind changes one node, so on a large cluster most filter, prioritize and bind calls
need no new decision. One ``DecisionCache`` serves the scheduler's three ways in:

- node objects (``on_nodes``: filter, score and prioritize over node lists, and ``on_node``:
  the check at reserve, which bind runs), where a remembered decision counts only for the very
  node object it was made on;
- node names from the cache's ``NodeTable`` (``on_names``: kube-scheduler's ``nodeCacheCapable``
  calls over thousands of names), answered with set operations over outcome indexes, so a call
  costs a few operations in C plus the nodes that changed since the last one.

Both read and fill one table per key (``KeyDecisions``), so a bind's reserve finds the decision
the names path made a moment before. What keeps it current, in one place:

- the ledger's change log: a node whose holdings changed is decided again (``catch_up``);
- the node table's change log, when names are asked (a node added, replaced or removed);
- the policy's ``version``: after a workload refresh every score is stale, but nodes that
  looked alike (same ``kind``, same usage ``signature``) still do, so one node per look-alike
  group is decided again and its outcome given to the whole group;
- another ledger object, or another node table for names, starts over.

Two rules keep the shortcut honest. A node whose device plugin relies on the hand-off and that
holds pending (unassigned) allocations is decided on its own, never through its look-alikes,
since the hand-off compares the pending containers, which the signature leaves out. A node
where the asking pod already holds a share is decided with that share left out (re-binding it)
and not remembered.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from gpushare.core.booking.changes import NodeTable
from gpushare.core.booking.ledger import Ledger
from gpushare.core.decision.decider import Decider, Decision
from gpushare.core.model.inventory import NodeInventory
from gpushare.core.model.requests import PodRequest
from gpushare.core.model.status import Code
from gpushare.core.placement.ranking import absolute
from gpushare.core.records.handoff import any_pending

Alike = tuple[object, ...]
"""(node kind, usage signature): look-alike nodes decide alike."""


class KeyDecisions:
    """The current decisions for one request key, with the indexes the names path reads.

    ``decisions`` is the one record per node. The outcome indexes (``fits``, ``tens``,
    ``failed``, ``unresolvable``) hold the same decisions by outcome, kept only while a node
    table is followed, so a filter over names is a few set operations.
    """

    def __init__(self, ledger: Ledger, version: int) -> None:
        self.ledger = ledger
        self.version = version
        """The policy's version the decisions were made under."""
        self.ledger_position = ledger.changes.position
        self.table: NodeTable | None = None
        """The node table followed, once names were asked about."""
        self.table_position = 0
        self.seen: dict[str, NodeInventory] = {}
        """The node object each decision was made on, while no table is followed."""
        self.nodes: Mapping[str, NodeInventory] = self.seen
        """Where the node each decision was made on is found: ``seen`` or the table."""
        self.decisions: dict[str, Decision | None] = {}
        """The current decision per node name (None: asked about by name, not in the table)."""
        self.fits: dict[str, float] = {}
        """Score in [0, 1] of every node that fits."""
        self.tens: dict[str, int] = {}
        """The same as 0..10 (absolute policies)."""
        self.failed: dict[str, str] = {}
        self.unresolvable: dict[str, str] = {}
        self.deferred: set[str] = set()
        """The names in ``failed`` that wait for another pod to start (``Code.WAIT``)."""
        self.absent: set[str] = set()
        """Names asked about that are not in the table (decided None)."""
        self.alike: dict[Alike, Decision] = {}
        """Decisions by look-alike key, under this version."""
        self.groups: dict[Alike, set[str]] = {}
        """The current names decided through each ``alike`` key."""
        self.key_of: dict[str, Alike] = {}

    def follow(self, table: NodeTable) -> None:
        """Answer for the names of ``table`` from now on, starting over."""
        self.table = table
        self.nodes = table
        self.table_position = table.changes.position
        self.seen = {}
        self.alike.clear()
        self._forget_all()

    def catch_up(self) -> None:
        """Forget the decisions on nodes that changed since the last call."""
        log = self.ledger.changes
        changed = log.since(self.ledger_position)
        self.ledger_position = log.position
        table = self.table
        if table is None:
            if changed is None:
                self.decisions.clear()
            else:
                pop = self.decisions.pop
                for name in changed:
                    pop(name, None)
            return
        replaced = table.changes.since(self.table_position)
        self.table_position = table.changes.position
        if changed is None or replaced is None:
            self._forget_all()
            return
        for name in {*changed, *replaced}:
            self.decisions.pop(name, None)
            key = self.key_of.pop(name, None)
            if key is not None:
                self.groups[key].discard(name)
            self.fits.pop(name, None)
            self.tens.pop(name, None)
            self.failed.pop(name, None)
            self.unresolvable.pop(name, None)
            self.deferred.discard(name)
            self.absent.discard(name)

    def restart(self, version: int) -> dict[Alike, set[str]]:
        """Forget every decision for a new policy version; the look-alike groups as they were."""
        groups = self.groups
        self.groups = {}
        self.alike = {}
        self.version = version
        self._forget_all()
        return groups

    def _forget_all(self) -> None:
        self.decisions.clear()
        self.fits.clear()
        self.tens.clear()
        self.failed.clear()
        self.unresolvable.clear()
        self.deferred.clear()
        self.absent.clear()
        self.groups.clear()
        self.key_of.clear()

    def remember(self, node: NodeInventory, decision: Decision) -> None:
        """Keep a decision made on a node object, if it is the one this table answers for."""
        name = node.name
        if self.table is None:
            self.seen[name] = node
            self.decisions[name] = decision
        elif self.table.get(name) is node:
            self.put(name, decision)

    def put(self, name: str, decision: Decision | None, key: Alike | None = None) -> None:
        """Record the decision on a node not decided yet (None: the node is not in the table).

        ``key``: the node's look-alike key, when its decision follows from it alone.
        """
        self.decisions[name] = decision
        if key is not None:
            self.key_of[name] = key
            group = self.groups.get(key)
            if group is None:
                self.groups[key] = {name}
            else:
                group.add(name)
        if decision is None:
            self.absent.add(name)
            return
        verdict, score = decision
        if verdict.fits:
            self.fits[name] = score
            self.tens[name] = absolute(score)
        elif verdict.status.may_pass_later:
            self.failed[name] = verdict.message
            if verdict.code is Code.WAIT:
                self.deferred.add(name)
        else:
            self.unresolvable[name] = verdict.message

    def put_group(self, key: Alike, names: set[str], decision: Decision) -> None:
        """Record one decision for every name of a look-alike group (none decided yet)."""
        self.alike[key] = decision
        self.groups[key] = names
        self.decisions.update(dict.fromkeys(names, decision))
        self.key_of.update(dict.fromkeys(names, key))
        verdict, score = decision
        if verdict.fits:
            self.fits.update(dict.fromkeys(names, score))
            self.tens.update(dict.fromkeys(names, absolute(score)))
        elif verdict.status.may_pass_later:
            self.failed.update(dict.fromkeys(names, verdict.message))
            if verdict.code is Code.WAIT:
                self.deferred.update(names)
        else:
            self.unresolvable.update(dict.fromkeys(names, verdict.message))


class DecisionCache:
    """Decisions per request key, current for the ledger and node table they are asked on."""

    def __init__(self, decider: Decider, limit: int = 256) -> None:
        self.decider = decider
        self.limit = limit
        """Request keys remembered before starting over."""
        self._keys: dict[tuple[object, ...], KeyDecisions] = {}
        self._ledger: Ledger | None = None
        self._version = 0

    def __len__(self) -> int:
        """Request keys remembered now."""
        return len(self._keys)

    def _current(
        self, request: PodRequest, ledger: Ledger, table: NodeTable | None = None
    ) -> KeyDecisions:
        """The request key's decisions, caught up with every change since they were made."""
        version = self.decider.version
        if ledger is not self._ledger:
            self._keys.clear()
            self._ledger = ledger
        elif version != self._version:
            # decisions on node objects cannot be regrouped: drop them at once
            self._keys = {k: d for k, d in self._keys.items() if d.table is not None}
        self._version = version
        key = self.decider.key(request)
        known = self._keys.get(key)
        if known is None:
            if len(self._keys) >= self.limit:
                self._keys.clear()
            known = self._keys[key] = KeyDecisions(ledger, version)
        if table is not None and known.table is not table:
            known.follow(table)
        known.catch_up()
        if known.version != version:
            self._regroup(request, known, version)
        return known

    def _regroup(self, request: PodRequest, known: KeyDecisions, version: int) -> None:
        """Decide one node per look-alike group again, for the whole group.

        After a workload refresh every score is stale, but nodes that looked alike still do, so
        a refresh costs one decision per kind of node and usage, not one per node. A group
        the pod did not fit keeps its decision: whether a pod fits, and why not, is the
        filter's alone; the policy only chooses among GPUs that fit, and scores nodes that do.
        """
        before = known.alike
        groups = known.restart(version)
        for key, names in groups.items():
            if not names:
                continue
            decision = before.get(key)
            if decision is None or decision[0].fits:
                name = next(iter(names))
                node = known.nodes[name]
                decision = self.decider.decide(request, node, known.ledger.usage(name))
            known.put_group(key, names, decision)

    def on_nodes(
        self, request: PodRequest, nodes: Sequence[NodeInventory], ledger: Ledger
    ) -> list[Decision]:
        """The decision on each node object, in order; the pod's own holding left out."""
        known = self._current(request, ledger)
        get = known.decisions.get
        node_of = known.nodes.get
        held = ledger.nodes_held_by(request.uid)
        decide = self.decider.decide
        out: list[Decision] = []
        append = out.append
        for node in nodes:
            name = node.name
            hit = get(name)
            if hit is not None and node_of(name) is node and name not in held:
                verdict = hit[0]
                if verdict.node is not name and verdict.node != name:  # decided via a look-alike
                    hit = (replace(verdict, node=name), hit[1])
                append(hit)
                continue
            if name in held:  # re-binding: its own share is left out, nothing remembered
                append(decide(request, node, ledger.usage(name, excluding=request.uid)))
                continue
            decision = decide(request, node, ledger.usage(name))
            known.remember(node, decision)
            append(decision)
        return out

    def on_node(self, request: PodRequest, node: NodeInventory, ledger: Ledger) -> Decision:
        """The decision on one node object (the check at reserve)."""
        return self.on_nodes(request, (node,), ledger)[0]

    def on_names(
        self, request: PodRequest, wanted: set[str], table: NodeTable, ledger: Ledger
    ) -> KeyDecisions:
        """The key's decisions, current for every name in ``wanted`` (read them by outcome).

        The pod's own holding is not left out here: ``rebinding`` decides those nodes.
        """
        known = self._current(request, ledger, table)
        missing = wanted.difference(known.decisions)
        if not missing:
            return known
        alike = known.alike
        decide = self.decider.decide
        for name in missing:
            node = table.get(name)
            if node is None:
                known.put(name, None)
                continue
            usage = ledger.usage(name)
            if node.handoff and any_pending(usage.allocations):
                # the hand-off compares pending containers, which the signature leaves out
                known.put(name, decide(request, node, usage))
                continue
            key = (node.kind, usage.signature)
            decision = alike.get(key)
            if decision is None:
                decision = alike[key] = decide(request, node, usage)
            known.put(name, decision, key)
        return known

    def caught_up(self, request: PodRequest, table: NodeTable, ledger: Ledger) -> KeyDecisions:
        """The key's decisions caught up with every change, without deciding names not yet
        decided: for a second look at names ``on_names`` has just made current."""
        return self._current(request, ledger, table)

    def rebinding(
        self,
        request: PodRequest,
        names: Iterable[str],
        nodes: Mapping[str, NodeInventory],
        ledger: Ledger,
    ) -> dict[str, Decision]:
        """Decisions on the named nodes where the pod already holds something, its share left
        out (``on_names`` counts it)."""
        out: dict[str, Decision] = {}
        held = ledger.nodes_held_by(request.uid)
        if not held:  # the usual case: no set of thousands of names to build
            return out
        for name in held & set(names):
            node = nodes.get(name)
            if node is not None:
                usage = ledger.usage(name, excluding=request.uid)
                out[name] = self.decider.decide(request, node, usage)
        return out
