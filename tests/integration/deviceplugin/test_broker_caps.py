"""The accounting broker's connection caps, against a hostile client in a process of its own.

The hostile "containers" connect from a child process, so their descriptors are its own and the
plugin's (this test process's) are only the broker's side, as on a node. The plugin runs under a
lowered open-file limit, so that what the caps protect (Allocate, files, PodResources) would
fail with ``Too many open files`` without them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpushare.core.admitting.isolationpaths import CONTAINER_BROKER_DIR
from gpushare.core.model.inventory import Mode
from gpushare.core.model.names import ANN_ASSIGNED
from gpushare.deviceplugin.config import Stats
from gpushare.deviceplugin.metrics import registry_for
from gpushare.kube.watchhealth import WatchHealth
from gpushare.node.descriptors import RESERVED, BrokerCaps, CapsError
from gpushare.node.enforcement.accounts import BY_DEVICES
from gpushare.node.enforcement.broker import SOCKET_NAME, Broker
from tests.support import grpc_loop
from tests.support.isolating import admit, ask, fake_library, isolation
from tests.support.pluginrig import MEM, Rig, pod, run

GiB = 2**30
LIMIT = 1024
"""The plugin's open-file limit in these tests: a container's usual soft limit."""

HOSTILE = r"""
import json, resource, selectors, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
n, paths = int(sys.argv[1]), sys.argv[2:]
counts = {"served": 0, "refused": 0, "silent": 0, "unconnected": 0}
socks, first = [], b""
until = time.monotonic() + 10  # a broker that takes none for 10 s leaves the rest unconnected
for path in paths:
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(2)
        while True:  # a full backlog answers EAGAIN at once: try again while it drains
            try:
                s.connect(path)
                s.sendall(b"used 0\n")
            except BlockingIOError:
                if time.monotonic() < until:
                    time.sleep(0.001)
                    continue
            except OSError:
                pass
            else:
                socks.append(s)
                until = time.monotonic() + 10  # a slow machine drains slowly, not never
                break
            s.close()
            counts["unconnected"] += 1
            break
sel = selectors.DefaultSelector()
for s in socks:
    s.setblocking(False)
    sel.register(s, selectors.EVENT_READ)
waiting, deadline = len(socks), time.monotonic() + 10
while waiting and time.monotonic() < deadline:
    for key, _ in sel.select(timeout=0.5):
        try:
            data = key.fileobj.recv(200)
        except OSError:
            data = b""
        sel.unregister(key.fileobj)
        waiting -= 1
        if data.startswith(b"used "):
            counts["served"] += 1
        elif data.startswith(b"error too many connections"):
            counts["refused"] += 1
            first = first or data
        else:
            counts["silent"] += 1
counts["silent"] += waiting
counts["why"] = first.decode().strip()
print(json.dumps(counts), flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def open_file_limit(soft: int) -> Iterator[None]:
    """Run the plugin (this process) under a lower soft open-file limit."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


@contextlib.asynccontextmanager
async def hostile(per_socket: int, *socks: Path) -> AsyncIterator[dict[str, Any]]:
    """Connections from another process, ``per_socket`` to each socket, held until the end."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        HOSTILE,
        str(per_socket),
        *map(str, socks),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 40)
        yield json.loads(line)
    finally:
        proc.stdin.close()
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


def broker_socket(admitted: Any, container: str) -> Path:
    (host,) = [h for c, h, _ in admitted.mounts[container] if c == CONTAINER_BROKER_DIR]
    return Path(host) / SOCKET_NAME


def hook(caps: BrokerCaps | None = None) -> Any:
    """No caps: the hook's defaults, under the process's open-file limit."""
    return isolation(packaged=fake_library(), **({"caps": caps} if caps is not None else {}))


async def first_answer(path: Path, line: bytes) -> str:
    """A line to a broker socket, and its first answer (a refused connection's is why)."""
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.setblocking(False)
        await loop.sock_connect(sock, str(path))
        with contextlib.suppress(ConnectionError):  # a refused one is closed after its answer
            await loop.sock_sendall(sock, line)
        answer = await asyncio.wait_for(loop.sock_recv(sock, 200), 5)
    return answer.decode().strip()


async def started(r: Rig, name: str) -> None:
    """Until the plugin marks the pod served (a pod of the same shape on the same GPU is placed
    only then: the hand-off must tell them apart)."""
    for _ in range(200):
        stored = await r.kube.get_pod("default", name)
        if stored["metadata"].get("annotations", {}).get(ANN_ASSIGNED) == "true":
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{name} never marked served")


def own_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


async def still_works(r: Rig, name: str) -> Path:
    """The plugin's own work under the load: files open, a new pod's Allocate is served."""
    _, admitted = await admit(r, pod(name, 1))
    assert admitted.envs["c0"]["GPUSHARE_MEM_LIMIT"] == str(GiB)
    files = [open(os.devnull) for _ in range(32)]  # noqa: SIM115 - held on purpose
    for f in files:
        f.close()
    return broker_socket(admitted, "c0")


def test_one_pods_containers_share_its_cap_and_another_pod_is_served() -> None:
    """20 containers x 1,100 connections spent a node's descriptors: a pod now has its cap, and
    each of its containers what it is kept (16 beyond the pod's 300 for one that came late)."""

    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        # three identical containers: kubelet cannot tell them apart, the pod is still known
        placed, admitted = await admit(r, pod("hostile", 1, 1, 1))
        socks = [broker_socket(admitted, c) for c in ("c0", "c1", "c2")]
        async with hostile(200, *socks) as got:
            # the pod's 300, and the 16 kept for each container whose first connections came
            # after the others had reached it: 300 when all three started early, 316 at most
            # (the three run at once, so the order is the scheduler's)
            served = got["served"]
            assert 300 <= served <= 316 and got["refused"] == 600 - served, got
            assert got["silent"] == got["unconnected"] == 0, got
            assert got["why"] == (
                "error too many connections: a pod may hold 300 (16 kept for each container)"
            )
            uid = placed["metadata"]["uid"]
            assert r.plugin.hook.chosen.broker.connections(uid) == served
            broker = r.plugin.hook.chosen.broker
            assert broker.stats.refused == {"pod": 600 - served}
            assert broker.stats.open == served
            # the CLI hands the plugin's counters to the broker: the metrics read them
            plugin = SimpleNamespace(
                stats=Stats(broker=broker.stats), source=r.gpus, health=WatchHealth(role="test")
            )
            exported = {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for m in registry_for(plugin, "n1").collect()
                for s in m.samples
            }
            assert (
                exported[
                    (
                        "gpushare_device_plugin_broker_connections_refused_total",
                        (("cap", "pod"), ("node", "n1")),
                    )
                ]
                == 600 - served
            )
            connections = ("gpushare_device_plugin_broker_connections", (("node", "n1"),))
            assert exported[connections] == served
            victim = await still_works(r, "victim")
            assert await ask(victim, "used 0") == [f"used 0 {GiB}"]
        # the hostile process is gone: its connections, and the pod's count, with it
        for _ in range(100):
            if r.plugin.hook.chosen.broker.stats.open == 0:
                break
            await asyncio.sleep(0.05)
        assert r.plugin.hook.chosen.broker.stats.open == 0
        assert r.plugin.hook.chosen.broker.connections(uid) == 0

    with open_file_limit(LIMIT):
        run(body, mode=Mode.CGPU, hook=hook(BrokerCaps(per_pod=300, descriptors=LIMIT)))


def test_the_node_keeps_its_descriptors_whatever_pods_open() -> None:
    """No caps given: the node's room is the open-file limit less the plugin's reserve, and less
    what eight more containers would be kept; a container arriving under the load is served."""

    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        baseline = own_descriptors()
        socks = []
        for name in ("a", "b"):
            _, admitted = await admit(r, pod(name, 1))
            socks.append(broker_socket(admitted, "c0"))
        async with hostile(600, *socks) as got:
            victim = await still_works(r, "victim")
            caps = r.plugin.hook.chosen.broker.caps
            assert got["silent"] == got["unconnected"] == 0, got
            assert got["served"] + got["refused"] == 1200, got
            # two sockets listened while the flood came: their share, kept back for 8 more
            assert got["served"] == caps.shared(2) == LIMIT - RESERVED - 2 - 8 * 16, got
            assert got["why"].startswith("error too many connections: a node (for the device")
            assert r.plugin.hook.chosen.broker.stats.refused["descriptors"] == got["refused"]
            # the victim's pod is admitted, and its own connection is served under the load
            assert await ask(victim, "used 0") == [f"used 0 {GiB}"]
            print(f"plugin descriptors: {baseline} before, {own_descriptors()} under the load")

    with open_file_limit(LIMIT):
        run(body, mode=Mode.CGPU, hook=hook())


def test_a_node_cap_bounds_every_pod_together() -> None:
    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        socks = []
        for name in ("a", "b", "c"):
            _, admitted = await admit(r, pod(name, 1))
            socks.append(broker_socket(admitted, "c0"))
        async with hostile(100, *socks) as got:
            # 8 x 16 held back for containers still to come; each of the three keeps its 16
            assert got["served"] == 250 - 8 * 16 and got["refused"] == 178, got
            assert got["why"] == (
                "error too many connections: a node may hold 250 (16 kept for each container)"
            )
            assert r.plugin.hook.chosen.broker.stats.refused == {"node": 178}

    run(body, mode=Mode.CGPU, hook=hook(BrokerCaps(per_pod=100, per_node=250)))


def test_pods_named_only_by_their_devices_are_counted_once_podresources_names_them() -> None:
    """Two identical pods: Allocate cannot say whose container it serves; PodResources can."""

    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        first = await r.place(pod("p", 1, 1))
        second = await r.place(pod("q", 1, 1))
        assert first is not None and second is not None
        admitted = await r.kubelet.admit(first)
        await r.kubelet.admit(second)
        broker = r.plugin.hook.chosen.broker
        socks = [broker_socket(admitted, c) for c in ("c0", "c1")]
        uid = first["metadata"]["uid"]
        named = keys(broker, socks)
        assert all(k.startswith(f"{BY_DEVICES}/") for k in named)  # either pod's, at Allocate
        for _ in range(100):  # the check reads PodResources every 50 ms here
            if [broker.pod(k) for k in named] == [uid, uid]:
                break
            await asyncio.sleep(0.05)
        assert [broker.pod(k) for k in named] == [uid, uid]
        async with hostile(60, *socks) as got:
            assert got["served"] == 100 and got["refused"] == 20, got
            assert broker.connections(uid) == 100

    run(body, mode=Mode.CGPU, hook=hook(BrokerCaps(per_pod=100)))


def keys(broker: Broker, socks: list[Path]) -> list[str]:
    return [sock.parent.relative_to(broker.root).as_posix() for sock in socks]


def test_idle_connections_holding_nothing_are_closed_and_holders_kept(tmp_path: Path) -> None:
    async def main() -> None:
        broker = Broker(tmp_path, caps=BrokerCaps(idle_s=0.2))
        sock = broker.open("uid/c0", (GiB,)) / SOCKET_NAME
        idle_reader, idle = await asyncio.open_unix_connection(str(sock))
        holder_reader, holder = await asyncio.open_unix_connection(str(sock))
        holder.write(b"reserve 0 1\n")
        assert await holder_reader.readline() == b"ok\n"
        await asyncio.sleep(0.6)
        assert await asyncio.wait_for(idle_reader.read(), 1) == b""  # closed by the broker
        holder.write(b"used 0\n")
        assert await holder_reader.readline() == f"used 1 {GiB}\n".encode()
        assert broker.stats.idle_closed == 1 and broker.stats.open == 1
        for writer in (idle, holder):
            writer.close()
            await writer.wait_closed()
        broker.close()
        await asyncio.sleep(0.05)  # the broker's side closes on the loop

    grpc_loop.run(main())


def test_accept_without_descriptors_pauses_instead_of_spinning(tmp_path: Path) -> None:
    async def main() -> None:
        broker = Broker(tmp_path, caps=BrokerCaps())
        path = broker.open("uid/c0", (GiB,)) / SOCKET_NAME
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(str(path))  # waits in the backlog: the loop has not run since
        spent = []
        with open_file_limit(own_descriptors() + 8):
            with contextlib.suppress(OSError):
                while True:
                    spent.append(os.open(os.devnull, os.O_RDONLY))
            await asyncio.sleep(1.5)
            errors = broker.stats.accept_errors
            for fd in spent:
                os.close(fd)
        assert 1 <= errors <= 3  # one try a second, not one per turn of the loop
        client.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(client, b"used 0\n")
        answer = await asyncio.wait_for(loop.sock_recv(client, 100), 5)
        assert answer == f"used 0 {GiB}\n".encode()
        client.close()
        broker.close()

    grpc_loop.run(main())


def test_caps_that_cannot_be_served_are_refused_naming_the_flag() -> None:
    with pytest.raises(CapsError, match="--broker-max-connections-per-pod=0 must be at least 1"):
        BrokerCaps(per_pod=0)
    with pytest.raises(CapsError, match=r"per-pod=3000 is more than .*per-node=2000"):
        BrokerCaps(per_pod=3000, per_node=2000)
    with pytest.raises(CapsError, match=r"per-container=0 must be from 1 .* to 1024"):
        BrokerCaps(kept=0)
    with pytest.raises(CapsError, match=r"per-container=64 must be from 1 .* to 50"):
        BrokerCaps(per_pod=50, kept=64)
    # a node too small to keep 16 for every container and 8 more keeps each an equal share
    assert BrokerCaps(per_pod=100, per_node=250).kept_each(containers=30) == 250 // 38
    with pytest.raises(CapsError, match="keeps 256 for its own work"):
        BrokerCaps(descriptors=200)
    assert BrokerCaps(descriptors=LIMIT).room(listeners=10) == LIMIT - RESERVED - 10
    assert BrokerCaps().room(listeners=10) == BrokerCaps().per_node


def test_the_device_plugin_refuses_caps_it_cannot_serve() -> None:
    from click.testing import CliRunner

    from gpushare.cli import main as gpushare

    for flags, words in (
        (["--broker-max-connections-per-pod=0"], "per-pod=0 must be at least 1"),
        (["--broker-max-connections-per-node=100"], "per-pod=2048 is more than"),
        (["--broker-idle-timeout=-1"], "--broker-idle-timeout=-1 must be 0 (never)"),
        (["--broker-min-connections-per-container=0"], "per-container=0 must be from 1"),
    ):
        out = CliRunner().invoke(
            gpushare, ["device-plugin", "--node-name=n", "--insecure-no-seal", *flags]
        )
        assert out.exit_code == 2 and words in out.output, out.output


def test_one_tenant_at_the_node_cap_leaves_every_other_container_its_own_connections() -> None:
    """Issue 56's third attack at its own numbers: 9 pods x 2 containers x 1,000 connections
    reach the node's 16,384; a pod of another tenant admitted afterwards must still allocate.

    Before containers were kept connections of their own, the victim's first connection was
    answered ``error too many connections: a node may hold 16384`` and every allocation of
    its pod failed until the attacker left.
    """

    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        socks = []
        for i in range(9):
            _, admitted = await admit(r, pod(f"tenant-a-{i}", 1, 1))
            socks += [broker_socket(admitted, c) for c in ("c0", "c1")]
            await started(r, f"tenant-a-{i}")  # the next one, the same shape, waits for it
        broker = r.plugin.hook.chosen.broker
        async with hostile(1000, *socks) as got:
            # a connect the attacker's own backlog kept waiting past its 10 s counts unconnected
            assert got["silent"] == 0, got
            _, admitted = await admit(r, pod("tenant-b", 1))
            victim = broker_socket(admitted, "c0")
            # a process of the victim allocates and exits (its memory back), then another one
            first = await first_answer(victim, b"reserve 0 1048576\n")
            second = await ask(victim, "reserve 0 1048576", "used 0") if first == "ok" else []
            print(
                f"\n[broker] tenant A, 18 containers x 1000: {got}; open {broker.stats.open} with "
                f"the victim's; the victim's allocations: {first!r}, {second}"
            )
            assert first == "ok" and second == ["ok", f"used 1048576 {GiB}"], (first, second)
            caps = broker.caps
            kept = caps.kept_each(len(socks))
            # the attacker took only the shared part: room for 8 more containers held back
            assert got["served"] == caps.shared(len(socks)) == caps.per_node - 8 * kept, got
            assert got["served"] + got["refused"] + got["unconnected"] == 18000, got
            assert got["why"].startswith("error too many connections: a node may hold 16384"), got

    run(body, mode=Mode.CGPU, hook=hook())
