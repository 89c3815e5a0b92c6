"""A container's GPU memory account, as the accounting broker keeps it (pure: no sockets here).

Every process of a container must see what the others hold, so usage cannot live in the process.
Kept in a file the container writes, it is the container's to falsify: a process could zero what
it holds and allocate past its limit. So the device plugin keeps it (``node.enforcement.broker``),
one :class:`Account` per container, and each process of the container talks to it over its own
connection to a unix socket. The connection is the identity: what a process reserves is charged
to its connection, and closing the connection, which the kernel does however the process ends,
gives all of it back. There is nothing to forge (no pid, no start time), and a process can only
ever give back its own charges.

The protocol is one ASCII line each way, at most :data:`MAX_LINE` bytes, fields separated by one
space, numbers in decimal without sign; ``D`` is the device ordinal inside the container (the
order of its limits), ``B`` a byte count:

===================  ==========================  ============================================
request              answer                      what it does
===================  ==========================  ============================================
``reserve D B``      ``ok`` or                   charge B to this connection unless the
                     ``refused USED LIMIT``      container would then hold more than its limit
``release D B``      ``ok``                      give back up to B of this connection's charge
``hold D B``         ``ok``                      charge B without the check: memory the
                                                 process already held when its connection
                                                 broke (the plugin restarted)
``used D``           ``used USED LIMIT``         what the whole container holds on D
``active D``         ``ok``                      the process launches on D now: the container
                                                 counts as active on that GPU (cGPU policies
                                                 1, 2 and 4; the broker tells the plugin)
===================  ==========================  ============================================

Anything else is answered ``error <why>``, and changes nothing. The limits are the plugin's, from
the allocation, never the container's. The interposer (``native/interposer.c``, the broker
section) is the client.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpushare.core.model.kubejson import whole_number

MAX_LINE = 96
"""Longest request line, newline included; longer ones close the connection."""
MAX_CONNECTIONS = 1024
"""Connections one container may hold open: its processes, as the usage table allowed."""
MAX_DEVICES = 16
"""Device ordinals a container may name (the interposer's ``GS_MAX_DEVS``)."""

OK = b"ok\n"


@dataclass
class Account:
    """One container's limits and what each of its connections holds."""

    limits: tuple[int, ...]
    """Bytes per device ordinal; a single value applies to every ordinal, as in the file."""
    holders: dict[int, list[int]] = field(default_factory=dict)
    """Connection id → bytes held per device ordinal."""
    _next: int = 0

    def __post_init__(self) -> None:
        if not self.limits or any(b <= 0 for b in self.limits):
            raise ValueError(f"limits must be positive byte counts, got {self.limits!r}")
        if len(self.limits) > MAX_DEVICES:
            raise ValueError(f"at most {MAX_DEVICES} devices, got {len(self.limits)}")

    def limit(self, dev: int) -> int | None:
        """The limit of a device ordinal, or None when the container has no such device."""
        if len(self.limits) == 1:
            return self.limits[0] if 0 <= dev < MAX_DEVICES else None
        return self.limits[dev] if 0 <= dev < len(self.limits) else None

    def used(self, dev: int) -> int:
        """Bytes the whole container holds on a device."""
        return sum(held[dev] for held in self.holders.values())

    def connect(self) -> int | None:
        """A new connection's id, or None when the container already has too many."""
        if len(self.holders) >= MAX_CONNECTIONS:
            return None
        self._next += 1
        self.holders[self._next] = [0] * MAX_DEVICES
        return self._next

    def holds(self, conn: int) -> bool:
        """Whether the connection holds any memory (closing it would give that back)."""
        return any(self.holders.get(conn, ()))

    def disconnect(self, conn: int) -> None:
        """The connection closed: everything charged to it is given back."""
        self.holders.pop(conn, None)

    def answer(self, conn: int, line: bytes) -> bytes:
        """The answer to one request line (newline included or not) on a connection."""
        held = self.holders.get(conn)
        if held is None:
            return b"error this connection is closed\n"
        words = line.rstrip(b"\n").split(b" ")
        verb = words[0].decode("ascii", "replace")
        arity = {"reserve": 3, "release": 3, "hold": 3, "used": 2, "active": 2}
        if verb not in arity:
            return b"error unknown request: use reserve, release, hold, used or active\n"
        numbers = [whole_number(w.decode("ascii", "replace")) for w in words[1:]]
        if len(words) != arity[verb] or None in numbers:
            return f"error {verb} takes {arity[verb] - 1} decimal number(s)\n".encode()
        dev = numbers[0] or 0
        limit = self.limit(dev)
        if limit is None:
            return f"error device {dev} is not this container's\n".encode()
        if verb == "used":
            return f"used {self.used(dev)} {limit}\n".encode()
        if verb == "active":
            return OK
        amount = numbers[1] or 0
        if verb == "reserve":
            used = self.used(dev)
            if used + amount > limit:
                return f"refused {used} {limit}\n".encode()
            held[dev] += amount
        elif verb == "hold":
            held[dev] += amount
        else:
            held[dev] -= min(amount, held[dev])
        return OK
