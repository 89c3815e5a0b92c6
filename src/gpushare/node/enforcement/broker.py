"""The accounting broker: each container's GPU memory usage, kept in the device plugin.

One unix socket per container, ``<state>/broker/<key>/broker.sock`` on the host, where ``key``
is the container's accounting key (``hooks.accounts.accounting_key``). Allocate mounts the socket's
directory read-only at ``/var/run/gpushare`` (connecting needs no write access to the mount),
so the container can reach its own account and nothing else, and can neither replace the
socket nor add one. The arithmetic and the protocol are ``gpushare.isolation.accounting``; this
module only moves lines between sockets and accounts, on the plugin's event loop.

Restarts: a restarted plugin opens every account again from the limits files it wrote
(``<state>/limits/<key>/limits``), with nothing held; the interposer in each process that holds
memory notices its broken connection (a thread of its own waits for it), reconnects within a
quarter second of the broker's return and declares what it holds (``hold``). Until then a
reservation could be given memory that an idle process still holds, so a reopened account holds
back answers to ``reserve`` for :data:`SETTLE_S` after it opens. Binding goes through
``/proc/self/fd/<dir>/broker.sock``, so the host path's length (a unix socket path has at most
107 bytes) never matters.

Activity: an ``active D`` line that the account accepts is passed on to ``on_active`` with the
account's key, before the answer goes back, so whatever the plugin does with it (rewriting a
cGPU schedule) is done when the interposer reads ``ok``. The key comes from the socket the
line arrived on, never from the line: a container reports for itself only.

Caps: every connection is a descriptor of the plugin's, so connections are capped per container
(``accounting.MAX_CONNECTIONS``), per pod and per node, and the node's cap never reaches into
the descriptors the plugin keeps for its own work (``node.descriptors``): no tenant can
make Allocate, PodResources or the API client fail with ``Too many open files``. The pod is the
one Allocate knew, or, for a container named by its device IDs, the one PodResources later
names (:meth:`Broker.attribute`).

Kept connections: caps alone let one tenant spend the node's budget for everyone (nine pods of
two containers, 1,000 connections each, reach 16,384, and every allocation of another tenant's
new pod then failed until the attacker left). So each served container is *kept* a few
connections (``BrokerCaps.kept``, 16): a connection within them is refused only when the
open-file limit itself is spent, never by the pod or node cap. The node's cap is charged, for
each container, the larger of its connections and what it is kept, and holds back room for
``descriptors.ARRIVALS`` more containers; a connection beyond what its container is kept is
taken only while that charge is under the cap (and the pod's and container's caps allow it).
Whatever one tenant opens, across any number of pods and namespaces, it takes only from the
shared part, and every other container still opens its own. The heavy holder is refused, not
closed: a connection may hold memory, and closing it would give memory back to the account
while the process still uses it. Refusal rather than eviction also needs no notion of tenant:
what a container is kept does not depend on who else is on the node.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpushare.core.admitting.isolationpaths import CONTAINER_BROKER_DIR
from gpushare.isolation.accounting import MAX_CONNECTIONS, MAX_LINE, OK, Account
from gpushare.node.descriptors import BrokerCaps, soft_limit

log = logging.getLogger(__name__)

SOCKET_NAME = "broker.sock"
CONTAINER_BROKER_SOCKET = f"{CONTAINER_BROKER_DIR}/{SOCKET_NAME}"
"""Where the interposer finds the socket (the limits file's ``broker`` setting)."""
BACKLOG = 128
SETTLE_S = 1.0
"""How long a restored account delays reservations: four of the interposer's reconnect tries."""
ACCEPT_BATCH = 16
"""Connections taken per wake-up of one socket, so that a busy container cannot starve others."""
ACCEPT_RETRY_S = 1.0
"""How long a socket waits after accept() ran out of descriptors or memory (asyncio's own)."""
RESOURCE_ERRORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


@dataclass
class BrokerStats:
    """The accounting broker's connections: how many are open and why others were closed."""

    open: int = 0
    """Connections open now, on every container's socket."""
    refused: dict[str, int] = field(default_factory=dict)
    """Connections closed at once, by the cap they met: container, pod, node, descriptors."""
    idle_closed: int = 0
    """Connections holding nothing, closed after the idle timeout."""
    accept_errors: int = 0
    """accept() failures for want of descriptors or memory (the socket pauses a second)."""


CAP_WORDS = {
    "container": "container",
    "pod": "pod",
    "node": "node",
    "descriptors": "node (for the device plugin's descriptors)",
}


@dataclass
class _Open:
    """One container's account, its listening socket and its live connections."""

    key: str
    pod: str
    """What the pod cap counts the connections under (the pod's UID when known)."""
    account: Account
    listener: socket.socket
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    settle_until: float = 0.0
    """Loop time before which reservations wait (a restored account)."""
    paused: asyncio.TimerHandle | None = None
    """Set while accepting waits after accept() ran out of descriptors."""


class Broker:
    """Every container account of this node, served on the running event loop.

    Connections are taken by the broker itself, one ``accept`` at a time, and each is checked
    against the caps (:class:`~gpushare.node.descriptors.BrokerCaps`) before anything
    is built around it: one over a cap is answered ``error too many connections ...`` and
    closed at once, so it holds a descriptor for microseconds, and the client, not the
    plugin, is left without. A connection holding no memory that stays silent for the idle
    timeout is closed (the interposer reconnects when it next asks); one holding memory is
    kept, since closing it would give its memory back. When ``accept`` itself fails for want
    of descriptors or memory, that socket stops accepting for :data:`ACCEPT_RETRY_S`, rather
    than waking the loop again and again for a connection it cannot take.
    """

    def __init__(
        self,
        root: Path,
        *,
        on_active: Callable[[str, int], None] | None = None,
        caps: BrokerCaps | None = None,
        stats: BrokerStats | None = None,
    ) -> None:
        self.root = root
        self.on_active = on_active
        """Told ``(key, device ordinal)`` for each accepted ``active`` line."""
        self.caps = caps or BrokerCaps(descriptors=soft_limit())
        """Without caps of its own, the defaults under the process's open-file limit."""
        self.stats = stats or BrokerStats()
        self._open: dict[str, _Open] = {}
        self._per_pod: dict[str, int] = {}
        """Open connections per pod."""

    def open(
        self, key: str, limits: tuple[int, ...], *, pod: str | None = None, settle_s: float = 0.0
    ) -> Path:
        """Serve a container's account, empty, at ``<root>/<key>``; that directory.

        Whatever was served under the key before is closed first: an Allocate for a key is a
        new container (kubelet allocates once per container, not on its restarts). ``pod``
        names the pod its connections count against (default: the key alone, until
        :meth:`attribute` names it). ``settle_s`` delays reservations, for accounts whose
        processes may hold memory already.
        """
        self.drop(key)
        account = Account(limits)
        directory = self.root / key
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o755)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            short = f"/proc/self/fd/{fd}/{SOCKET_NAME}"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(short)
            listener.bind(short)
            # every user of the container must connect; only that container mounts it
            os.chmod(short, 0o666)
            listener.listen(BACKLOG)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        finally:
            os.close(fd)
        loop = asyncio.get_running_loop()
        entry = _Open(key, pod or key, account, listener, settle_until=loop.time() + settle_s)
        self._open[key] = entry
        # listening already: connections wait in the backlog until the loop takes them
        loop.add_reader(listener.fileno(), self._accept, entry)
        return directory

    def attribute(self, key: str, pod: str) -> None:
        """Count a served container's connections against ``pod`` from now on."""
        entry = self._open.get(key)
        if entry is None or entry.pod == pod:
            return
        held = len(entry.account.holders)
        self._count(entry.pod, -held)
        entry.pod = pod
        self._count(pod, held)

    def _count(self, pod: str, delta: int) -> None:
        left = self._per_pod.get(pod, 0) + delta
        if left > 0:
            self._per_pod[pod] = left
        else:
            self._per_pod.pop(pod, None)

    def _cap_met(self, entry: _Open) -> str:
        """The cap a new connection of this container would pass, or ""."""
        held = len(entry.account.holders)
        if held >= MAX_CONNECTIONS:
            return "container"
        containers = len(self._open)
        hard = self.caps.hard(containers)
        if hard is not None and self.stats.open >= hard:
            return "descriptors"
        kept = self.caps.kept_each(containers)
        if held < kept:
            return ""  # the container's own: no other container can have taken them
        if self._per_pod.get(entry.pod, 0) >= self.caps.per_pod:
            return "pod"
        if self.charged(kept) >= self.caps.shared(containers):
            return "descriptors" if self.caps.room(containers) < self.caps.per_node else "node"
        return ""

    def charged(self, kept: int) -> int:
        """What the node's cap is charged: each container's connections, or ``kept`` if more."""
        return sum(max(len(e.account.holders), kept) for e in self._open.values())

    def _accept(self, entry: _Open) -> None:
        """Take the connections waiting on a container's socket (the loop calls it)."""
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _ = entry.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                if err.errno in RESOURCE_ERRORS:
                    self._pause(entry, err)
                    return
                continue  # this connection went away before it was taken
            cap = self._cap_met(entry)
            conn = None if cap else entry.account.connect()
            if conn is None:
                self._refuse(sock, cap or "container")
                continue
            self.stats.open += 1
            self._count(entry.pod, 1)
            task = asyncio.get_running_loop().create_task(self._serve(entry, conn, sock))
            entry.tasks.add(task)
            task.add_done_callback(entry.tasks.discard)

    def _pause(self, entry: _Open, err: OSError) -> None:
        """accept() had no descriptor or memory: stop listening a while instead of spinning."""
        self.stats.accept_errors += 1
        log.warning(
            "key=%s phase=broker cannot accept (%s): paused %.0fs", entry.key, err, ACCEPT_RETRY_S
        )
        loop = asyncio.get_running_loop()
        loop.remove_reader(entry.listener.fileno())

        def resume() -> None:
            entry.paused = None
            if self._open.get(entry.key) is entry:
                loop.add_reader(entry.listener.fileno(), self._accept, entry)

        entry.paused = loop.call_later(ACCEPT_RETRY_S, resume)

    def _refuse(self, sock: socket.socket, cap: str) -> None:
        """Answer a connection over a cap with why, and close it."""
        self.stats.refused[cap] = self.stats.refused.get(cap, 0) + 1
        containers = len(self._open)
        limit = {
            "container": MAX_CONNECTIONS,
            "pod": self.caps.per_pod,
            "node": self.caps.per_node,
            "descriptors": self.caps.room(containers),
        }[cap]
        kept = self.caps.kept_each(containers)
        why = f"error too many connections: a {CAP_WORDS[cap]} may hold {limit}"
        if cap in ("pod", "node"):
            why += f" ({kept} kept for each container)"
        with contextlib.suppress(OSError):
            sock.setblocking(False)
            sock.send(f"{why}\n".encode())
        sock.close()

    async def _serve(self, entry: _Open, conn: int, sock: socket.socket) -> None:
        writer: asyncio.StreamWriter | None = None
        try:
            reader, writer = await asyncio.open_unix_connection(sock=sock, limit=MAX_LINE)
            while True:
                idle = None if entry.account.holds(conn) else self.caps.idle_s or None
                try:
                    async with asyncio.timeout(idle):
                        line = await reader.readuntil(b"\n")
                except TimeoutError:
                    self.stats.idle_closed += 1
                    break
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                    break
                wait = entry.settle_until - asyncio.get_running_loop().time()
                if wait > 0 and line.startswith(b"reserve "):
                    await asyncio.sleep(wait)
                answer = entry.account.answer(conn, line)
                if answer == OK and line.startswith(b"active ") and self.on_active is not None:
                    self._tell_active(entry.key, line)
                writer.write(answer)
                # a client that does not read its answers is idle too
                async with asyncio.timeout(self.caps.idle_s or None):
                    await writer.drain()
        except (OSError, TimeoutError):
            pass
        finally:
            entry.account.disconnect(conn)
            self.stats.open -= 1
            self._count(entry.pod, -1)
            if writer is None:
                sock.close()
            else:
                writer.close()

    def _tell_active(self, key: str, line: bytes) -> None:
        """Pass an accepted activity report on; the plugin's failure is logged, not the client's."""
        assert self.on_active is not None
        try:
            self.on_active(key, int(line.split()[1]))
        except Exception:  # the report was valid: the broker must keep serving the account
            log.exception("key=%s phase=active report not applied", key)

    def usage(self, key: str) -> tuple[int, ...] | None:
        """Bytes the container holds per device ordinal of its limits, or None if not served."""
        entry = self._open.get(key)
        if entry is None:
            return None
        return tuple(entry.account.used(d) for d in range(len(entry.account.limits)))

    def limits(self, key: str) -> tuple[int, ...] | None:
        """Bytes the container may hold per device ordinal, or None if not served."""
        entry = self._open.get(key)
        return None if entry is None else tuple(entry.account.limits)

    def served(self) -> list[str]:
        """The keys served."""
        return sorted(self._open)

    def pod(self, key: str) -> str | None:
        """What the pod cap counts a served container's connections under."""
        entry = self._open.get(key)
        return None if entry is None else entry.pod

    def connections(self, pod: str) -> int:
        """Open connections counted against a pod."""
        return self._per_pod.get(pod, 0)

    def drop(self, key: str) -> None:
        """Stop serving a container's account and close its connections."""
        entry = self._open.pop(key, None)
        if entry is None:
            return
        if entry.paused is not None:
            entry.paused.cancel()
        else:
            with contextlib.suppress(RuntimeError):  # no loop: nothing was added to one
                asyncio.get_running_loop().remove_reader(entry.listener.fileno())
        entry.listener.close()
        for task in list(entry.tasks):
            task.cancel()

    def close(self) -> None:
        """Stop serving every account (the sockets stay for the next plugin to bind again)."""
        for key in list(self._open):
            self.drop(key)
