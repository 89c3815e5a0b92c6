"""The accounting broker: each container's GPU memory usage, kept in the device plugin.

One unix socket per container, ``<state>/broker/<key>/broker.sock`` on the host, where ``key``
is the container's accounting key (``isolation.accounting_key``). Allocate mounts the socket's
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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpushare.core.isolationpaths import CONTAINER_BROKER_DIR
from gpushare.isolation.accounting import MAX_LINE, OK, Account

log = logging.getLogger(__name__)

SOCKET_NAME = "broker.sock"
CONTAINER_BROKER_SOCKET = f"{CONTAINER_BROKER_DIR}/{SOCKET_NAME}"
"""Where the interposer finds the socket (the limits file's ``broker`` setting)."""
BACKLOG = 128
SETTLE_S = 1.0
"""How long a restored account delays reservations: four of the interposer's reconnect tries."""


@dataclass
class _Open:
    """One container's account, its listening socket and its live connections."""

    key: str
    account: Account
    listener: socket.socket
    server: asyncio.Task[asyncio.Server]
    writers: set[asyncio.StreamWriter] = field(default_factory=set)
    settle_until: float = 0.0
    """Loop time before which reservations wait (a restored account)."""


class Broker:
    """Every container account of this node, served on the running event loop."""

    def __init__(self, root: Path, *, on_active: Callable[[str, int], None] | None = None) -> None:
        self.root = root
        self.on_active = on_active
        """Told ``(key, device ordinal)`` for each accepted ``active`` line."""
        self._open: dict[str, _Open] = {}

    def open(self, key: str, limits: tuple[int, ...], *, settle_s: float = 0.0) -> Path:
        """Serve a container's account, empty, at ``<root>/<key>``; that directory.

        Whatever was served under the key before is closed first: an Allocate for a key is a
        new container (kubelet allocates once per container, not on its restarts). ``settle_s``
        delays reservations, for accounts whose processes may hold memory already.
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

        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._serve(entry, reader, writer)

        # listening already: connections wait in the backlog until the server takes them
        server = asyncio.get_running_loop().create_task(
            asyncio.start_unix_server(on_connect, sock=listener, limit=MAX_LINE)
        )
        loop = asyncio.get_running_loop()
        entry = _Open(key, account, listener, server, settle_until=loop.time() + settle_s)
        self._open[key] = entry
        return directory

    async def _serve(
        self, entry: _Open, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        conn = entry.account.connect()
        if conn is None:
            writer.write(b"error too many connections: a container may hold 1024\n")
            writer.close()
            return
        entry.writers.add(writer)
        try:
            while True:
                try:
                    line = await reader.readuntil(b"\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
                    break
                wait = entry.settle_until - asyncio.get_running_loop().time()
                if wait > 0 and line.startswith(b"reserve "):
                    await asyncio.sleep(wait)
                answer = entry.account.answer(conn, line)
                if answer == OK and line.startswith(b"active ") and self.on_active is not None:
                    self._tell_active(entry.key, line)
                writer.write(answer)
                await writer.drain()
        except OSError:
            pass
        finally:
            entry.account.disconnect(conn)
            entry.writers.discard(writer)
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

    def served(self) -> list[str]:
        """The keys served."""
        return sorted(self._open)

    def drop(self, key: str) -> None:
        """Stop serving a container's account and close its connections."""
        entry = self._open.pop(key, None)
        if entry is None:
            return
        if entry.server.done() and not entry.server.cancelled() and not entry.server.exception():
            entry.server.result().close()
        else:
            entry.server.cancel()
        entry.listener.close()
        for writer in list(entry.writers):
            writer.close()

    def close(self) -> None:
        """Stop serving every account (the sockets stay for the next plugin to bind again)."""
        for key in list(self._open):
            self.drop(key)
