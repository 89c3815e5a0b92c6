"""Which names changed since a position: how memos stay current without a scan.

The ledger logs every node whose holdings change and the cache's ``NodeTable`` every node that
is added, replaced or removed. A memo remembers the position it has seen up to and asks for
the names touched since, so a filter over thousands of nodes re-decides only the few a bind
changed. The log is cut in half when it grows past ``limit``; a reader whose position was cut
is told to start over (``None``).
"""

from __future__ import annotations

from collections.abc import Iterable

from gpushare.core.model.inventory import NodeInventory


class ChangeLog:
    """Names appended as they change; positions count from the start of time."""

    def __init__(self, limit: int = 100_000) -> None:
        self._limit = limit
        self._names: list[str] = []
        self._base = 0

    @property
    def position(self) -> int:
        """The position after the last change."""
        return self._base + len(self._names)

    def add(self, name: str) -> None:
        """Record that ``name`` changed."""
        self._names.append(name)
        if len(self._names) > self._limit:
            cut = len(self._names) // 2
            del self._names[:cut]
            self._base += cut

    def since(self, position: int) -> list[str] | None:
        """Names changed after ``position`` (repeats possible), or None when it was cut."""
        if position < self._base:
            return None
        return self._names[position - self._base :]


class NodeTable(dict[str, NodeInventory]):
    """Node inventories by name that log which names were set or removed.

    Reads are plain dict reads; only item assignment, ``pop`` and ``del`` are logged, which is
    all the cache uses (a relist builds a new table).
    """

    def __init__(self, items: Iterable[tuple[str, NodeInventory]] = ()) -> None:
        super().__init__(items)
        self.changes = ChangeLog()

    def __setitem__(self, name: str, node: NodeInventory) -> None:
        super().__setitem__(name, node)
        self.changes.add(name)

    def __delitem__(self, name: str) -> None:
        super().__delitem__(name)
        self.changes.add(name)

    def pop(self, name: str, *default: NodeInventory | None) -> NodeInventory | None:  # type: ignore[override]
        """Remove and return a node (logged)."""
        self.changes.add(name)
        return super().pop(name, *default)
