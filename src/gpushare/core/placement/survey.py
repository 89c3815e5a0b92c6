"""The whole cluster's node states, followed for the scarce shapes' supply
(``core.placement.scarcity``).

A price depends on every node, not only the ones a call asks about: kube-scheduler sends the
extender the nodes its own filters passed, and the memory simulator only the candidates. So
the survey follows the cluster's node table and the ledger through their change logs
(``core.booking.changes``), telling the supply each node whose inventory or holdings changed; a bind
costs one node's update. Without a table (node lists from a scheduler that has no node cache)
it follows every node object it has been shown.

What a node offers the policies lives here too (``free_units``, ``cpu_free``, ``state_of``), so
the supply and the per-node scores read a node the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpushare.core.booking.changes import NodeTable
from gpushare.core.booking.ledger import Ledger, NodeUsage
from gpushare.core.model.inventory import NodeInventory
from gpushare.core.placement.scarcity import State, Supply

UNLIMITED_CPU = 1 << 40
"""Free CPU of a node that does not report its allocatable: no limit."""


def cpu_free(node: NodeInventory, usage: NodeUsage) -> int:
    """Milli-CPU the node has left for more pods (no limit when it does not say)."""
    if not node.host.cpu_milli:
        return UNLIMITED_CPU
    return max(0, node.host.cpu_milli - usage.host.cpu_milli)


def free_units(node: NodeInventory, usage: NodeUsage) -> tuple[int, ...]:
    """Free memory units per GPU, in inventory order.

    A GPU that is unhealthy or out of service offers nothing, and neither does a node the
    filter refuses for a problem (it may still list its GPUs, as when the operator's
    ``gpushare.io/gpus-disabled`` cannot be read).
    """
    on = usage.gpus
    return tuple(
        max(0, g.mem_units - (on[g.index].mem_units if g.index in on else 0))
        if g.in_service and not node.problem
        else 0
        for g in node.gpus
    )


def state_of(node: NodeInventory, usage: NodeUsage) -> State:
    """A node as the supply counts it (shares sorted: the count ignores GPU order)."""
    return (tuple(sorted(free_units(node, usage))), cpu_free(node, usage), node.model)


class Survey:
    """Keeps a ``Supply`` current with one node table (or the nodes shown) and one ledger."""

    def __init__(self, supply: Supply) -> None:
        self.supply = supply
        self._table: Mapping[str, NodeInventory] | None = None
        self._ledger: Ledger | None = None
        self._table_position = 0
        self._ledger_position = 0
        self._shown = NodeTable()
        """Node objects shown by calls without a table."""

    def follow(self, table: Mapping[str, NodeInventory], ledger: Ledger) -> None:
        """Catch up with ``table`` and ``ledger``; another table or ledger starts over."""
        if table is not self._table or ledger is not self._ledger:
            self._restart(table, ledger)
            return
        changed = ledger.changes.since(self._ledger_position)
        replaced = table.changes.since(self._table_position) if isinstance(table, NodeTable) else []
        if changed is None or replaced is None:
            self._restart(table, ledger)
            return
        self._ledger_position = ledger.changes.position
        if isinstance(table, NodeTable):
            self._table_position = table.changes.position
        for name in {*changed, *replaced}:
            self._tell(name, table, ledger)

    def show(self, nodes: Iterable[NodeInventory], ledger: Ledger) -> None:
        """Follow the node objects of a call that names no table (kept across calls)."""
        shown = self._shown
        for node in nodes:
            if shown.get(node.name) is not node:
                shown[node.name] = node
        self.follow(shown, ledger)

    def _restart(self, table: Mapping[str, NodeInventory], ledger: Ledger) -> None:
        self._table = table
        self._ledger = ledger
        self._ledger_position = ledger.changes.position
        self._table_position = table.changes.position if isinstance(table, NodeTable) else 0
        self.supply.clear()
        for name in table:
            self._tell(name, table, ledger)

    def _tell(self, name: str, table: Mapping[str, NodeInventory], ledger: Ledger) -> None:
        node = table.get(name)
        if node is None:
            self.supply.update(name, None)
            return
        self.supply.update(name, state_of(node, ledger.usage(name)))
