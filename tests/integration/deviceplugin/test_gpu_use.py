"""GPU memory in use beside allocation: the device plugin's per-container series, the node's
summary, and ``kubectl inspect cgpu -d`` reading it (fake kubelet, real broker sockets)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client import generate_latest

from gpushare.core.model.inventory import Mode
from gpushare.core.model.names import ANN_NODE_GPU_USED
from gpushare.core.records.gpuuse import read_used
from gpushare.deviceplugin.metrics import registry_for
from gpushare.inspect.cli import collect
from gpushare.inspect.render import render_details
from gpushare.inspect.view import to_json
from gpushare.node.enforcement.broker import SOCKET_NAME
from gpushare.node.usage import UsedSummaryPublisher
from tests.support.isolating import GiB, admit, fake_library, isolation
from tests.support.pluginrig import NODE, Rig, pod, run
from tests.support.promql import labelled, scrape, target_label_clashes

AT = datetime(2026, 11, 26, 18, 0, tzinfo=UTC)


async def hold(sock: Path, nbytes: int) -> asyncio.StreamWriter:
    """A process of the container holding ``nbytes`` on device 0, until the writer closes."""
    reader, writer = await asyncio.open_unix_connection(str(sock))
    writer.write(f"reserve 0 {nbytes}\n".encode())
    assert (await reader.readline()).startswith(b"ok")
    return writer


def series(r: Rig, name: str) -> dict[tuple[str, ...], float]:
    text = generate_latest(registry_for(r.plugin, NODE, r.plugin.hook.usage)).decode()  # type: ignore[attr-defined]
    samples = {k: v for k, v in scrape(text, {}).items() if dict(k)["__name__"] == name}
    keys = ("pod_namespace", "pod_name", "container_name", "gpu", "UUID")
    return labelled(samples, *keys)


def test_containers_use_beside_their_limit_labelled_as_dcgm_exporter_labels_gpus() -> None:
    async def body(r: Rig) -> None:
        placed, _ = await admit(r, pod("trainer", 3, 2))
        uid = placed["metadata"]["uid"]
        allocation = json.loads(placed["metadata"]["annotations"]["gpushare.io/allocation"])
        gpu = str(allocation["containers"][0]["gpus"][0]["index"])
        uuid = f"GPU-fake-{NODE}-{gpu}"
        broker = r.root / "state" / "broker" / uid
        first = await hold(broker / "c0" / SOCKET_NAME, GiB)
        second = await hold(broker / "c0" / SOCKET_NAME, GiB // 2)
        used = series(r, "gpushare_container_gpu_memory_used_bytes")
        assert used == {
            ("default", "trainer", "c0", gpu, uuid): 1.5 * GiB,
            ("default", "trainer", "c1", gpu, uuid): 0.0,
        }
        text = generate_latest(registry_for(r.plugin, NODE, r.plugin.hook.usage)).decode()  # type: ignore[attr-defined]
        assert "gpushare_container_gpu_memory_used_bytes{" in text
        assert target_label_clashes(text) == set()
        limits = series(r, "gpushare_container_gpu_memory_limit_bytes")
        assert limits[("default", "trainer", "c0", gpu, uuid)] == 3 * GiB
        first.close()  # a process ends: what it held is given back
        await first.wait_closed()
        await asyncio.sleep(0.05)
        used = series(r, "gpushare_container_gpu_memory_used_bytes")
        assert used[("default", "trainer", "c0", gpu, uuid)] == 0.5 * GiB
        second.close()

    run(body, mode=Mode.CGPU, hook=isolation(packaged=fake_library()))


def test_the_owner_survives_a_plugin_restart(tmp_path: Path) -> None:
    async def body(r: Rig) -> None:
        placed, _ = await admit(r, pod("trainer", 3))
        uid = placed["metadata"]["uid"]
        # a new hook over the same state directory, as a restarted plugin builds it
        again = isolation(packaged=fake_library())(r.root, r.gpus)
        assert again.prepare(Mode.CGPU) is None
        [use] = again.usage()
        assert (use.namespace, use.pod_name, use.owner.container) == ("default", "trainer", "c0")
        assert use.limit_bytes == (3 * GiB,)
        assert (r.root / "state" / "limits" / uid / "c0" / "owner").is_file()
        again.close()

    run(body, mode=Mode.CGPU, hook=isolation(packaged=fake_library()))


def test_share_nodes_report_no_use() -> None:
    async def body(r: Rig) -> None:
        await admit(r, pod("trainer", 3))
        assert not r.plugin.hook.counts_usage  # type: ignore[attr-defined]
        assert series(r, "gpushare_container_gpu_memory_used_bytes") == {}

    run(body, mode=Mode.SHARE, hook=isolation(packaged=fake_library()))


def test_the_node_summary_is_written_when_use_moves_and_inspect_shows_it() -> None:
    async def body(r: Rig) -> None:
        placed, _ = await admit(r, pod("trainer", 3))
        uid = placed["metadata"]["uid"]
        hook = r.plugin.hook
        publisher = UsedSummaryPublisher(
            r.kube,
            NODE,
            usage=hook.usage,  # type: ignore[attr-defined]
            gpus=lambda: [g.index for g in r.gpus.gpus()],
            step_mib=1024,
            now=lambda: AT,
        )
        sock = r.root / "state" / "broker" / uid / "c0" / SOCKET_NAME
        writer = await hold(sock, 2 * GiB + 300 * 2**20)
        assert await publisher.publish()
        assert not await publisher.publish()  # nothing moved: no write
        more = await hold(sock, 512 * 2**20)
        assert not await publisher.publish()  # less than a unit (1 GiB): no write
        node = await r.kube.get_node(NODE)
        summary = read_used(node["metadata"]["annotations"])
        assert summary is not None and summary.at == "2026-11-26T18:00:00Z"
        gpu = next(i for i in (0, 1) if summary.on(i))
        assert summary.on(gpu) == 2348 and summary.on(1 - gpu) == 0
        view = await collect(r.kube)
        shown = render_details(view)
        print(shown)
        document = to_json(view)["nodes"][0]  # -o json and -o yaml carry the same
        assert document["usedAt"] == "2026-11-26T18:00:00Z"
        assert document["usedMib"] == {str(gpu): 2348, str(1 - gpu): 0}
        held = {gpu: "2.3/3", 1 - gpu: "0.0/0"}
        assert (
            f"Used :       GPU0 {held[0]}, GPU1 {held[1]} GiB in use/allocated "
            "(as of 2026-11-26T18:00:00Z)\n" in shown
        )
        more.close()
        writer.close()
        assert publisher.writes == 1

    run(body, mode=Mode.CGPU, hook=isolation(packaged=fake_library()))


def test_a_node_without_a_summary_renders_as_before() -> None:
    assert read_used({}) is None
    assert read_used({ANN_NODE_GPU_USED: "not json"}) is None
    assert read_used({ANN_NODE_GPU_USED: '{"at": "x", "used_mib": {"a": 1}}'}) is None
