"""What Allocate injects per node mode, over gRPC with the fake kubelet (no GPU, no MPS here)."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpushare.core.admitting import isolationpaths as paths
from gpushare.core.model.inventory import Mode
from gpushare.core.model.units import MemoryUnit
from gpushare.deviceplugin.config import PluginConfig
from gpushare.deviceplugin.plugin import DevicePlugin
from gpushare.isolation.build import LIB_NAME
from gpushare.isolation.limits import ContainerLimits
from gpushare.isolation.policy import (
    IDLE_AFTER_S,
    WEIGHT_ENV,
    Policy,
    slot_id,
)
from gpushare.kube.memory import MemoryKube
from gpushare.node.enforcement.accounts import BY_DEVICES, devices_key, prune_accounting
from gpushare.node.enforcement.broker import SOCKET_NAME
from gpushare.node.enforcement.library import PRELOAD_NAME
from gpushare.node.enforcement.mountcheck import DEVICE, SPEC_NAME, MountCheck
from gpushare.node.enforcement.mpsdaemon import MpsControl
from gpushare.node.enforcement.nodehook import NodeIsolation
from gpushare.node.gpus import FakeGpus, GpuInfo
from gpushare.node.preflight import StartRefused
from tests.support import grpc_loop
from tests.support.isolating import FakeDaemons, GiB, admit, ask, fake_library, isolation
from tests.support.pluginrig import CORE, MEM, NODE, Rig, bare_node, pod, run, served

PRELOAD = f"{paths.CONTAINER_LIB_DIR}/{LIB_NAME}"


def limits_text(mem: str, core: int = 0) -> str:
    """The limits file the plugin writes, as tests/golden/limits_file.txt spells it."""
    return (
        "# gpushare: this container's GPU limits, written by the device plugin and read by\n"
        "# libgpushare-cuda.so; they win over GPUSHARE_* in the environment.\n"
        f"version=2\nmem_limit={mem}\ncore_limit={core}\nunit=1GiB\n"
        "broker=/var/run/gpushare/broker.sock\n"
    )


def test_cgpu_containers_get_the_interposer_their_limit_and_their_own_accounting() -> None:
    library = fake_library()

    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        assert (r.root / "lib" / LIB_NAME).read_bytes() == library.read_bytes()
        preload = r.root / "lib" / PRELOAD_NAME
        assert preload.read_text() == f"{PRELOAD}\n"
        placed, admitted = await admit(r, pod("trainer", 3, 2))
        uid = placed["metadata"]["uid"]
        for name, size in (("c0", 3), ("c1", 2)):
            envs = admitted.envs[name]
            assert envs["LD_PRELOAD"] == PRELOAD
            assert envs["GPUSHARE_MEM_LIMIT"] == str(size * GiB)
            assert "GPUSHARE_ACCOUNTING_DIR" not in envs
            assert "GPUSHARE_CORE_LIMIT" not in envs
            assert envs["ALIYUN_COM_GPU_MEM_CONTAINER"] == str(size)
            broker = r.root / "state" / "broker" / uid / name
            sock = broker / SOCKET_NAME
            limits = r.root / "state" / "limits" / uid / name / "limits"
            # the container gets its broker's socket alone, in a directory mounted read-only:
            # it may connect (every user: they are unknown), and write nothing
            assert [p.name for p in broker.iterdir()] == [SOCKET_NAME]
            assert stat.S_ISSOCK(sock.stat().st_mode) and sock.stat().st_mode & 0o777 == 0o666
            assert broker.stat().st_mode & 0o777 == 0o755
            assert limits.read_text() == limits_text(str(size * GiB))
            assert limits.stat().st_mode & 0o777 == 0o444
            assert admitted.mounts[name] == [
                (paths.CONTAINER_LIB_DIR, str(r.root / "lib"), True),
                (paths.CONTAINER_PRELOAD_FILE, str(preload), True),
                (paths.CONTAINER_LIMITS_FILE, str(limits), True),
                (paths.CONTAINER_BROKER_DIR, str(broker), True),
            ]
            # the account is served, with the container's limit from the allocation
            assert await ask(sock, "used 0", f"reserve 0 {size * GiB + 1}") == [
                f"used 0 {size * GiB}",
                f"refused 0 {size * GiB}",
            ]

    run(body, mode=Mode.CGPU, hook=isolation(packaged=library))


class NvmlNamed:
    """The fake GPUs under UUIDs of NVML's form, as a real node's GPUs are named."""

    def __init__(self, source: FakeGpus) -> None:
        self.source = source

    def gpus(self) -> list[GpuInfo]:
        return [
            replace(g, uuid=f"GPU-{g.index:08x}-0000-4000-8000-00000000abcd")
            for g in self.source.gpus()
        ]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)


def test_the_limits_file_names_each_gpu_by_its_uuid() -> None:
    """The interposer matches each CUDA device to its limit by UUID, so the file names the UUID
    of each GPU in the order of its limits; a fake node's GPUs (not NVML's form) get none."""
    make = isolation(packaged=fake_library())

    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        # gpu-count 2, two containers of 3 units: each gets 1 unit of one GPU and 2 of the other
        _, admitted = await admit(r, pod("twins", 3, 3, gpu_count=2))
        for name in ("c0", "c1"):
            layout = [p.split(":") for p in admitted.envs[name]["GPUSHARE_MEM_PER_GPU"].split(",")]
            (host,) = [h for c, h, _ in admitted.mounts[name] if c == paths.CONTAINER_LIMITS_FILE]
            text = Path(host).read_text()
            limits = ContainerLimits.parse(text)
            assert limits.uuids == tuple(
                f"GPU-{int(i):08x}-0000-4000-8000-00000000abcd" for i, _ in layout
            )
            assert limits.mem_limit_bytes == tuple(int(m) * GiB for _, m in layout)
            assert sorted(limits.mem_limit_bytes) == [GiB, 2 * GiB]
            assert text.endswith(f"uuids={','.join(limits.uuids)}\n")

    run(body, mode=Mode.CGPU, hook=lambda root, source: make(root, NvmlNamed(source)))


def test_core_mem_holds_the_compute_limit_by_a_fixed_slice_and_mounts_once_per_container() -> None:
    """A core_mem container's computing power is its own slice of each period (policy 3).

    On an H100 the NVML-steered rate throttle this replaces swung between 10 % and 100 %
    (issue 37); slices of one schedule cannot overlap, so two containers on one GPU each keep
    their whole share.
    """

    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(CORE, 200)  # one device per percent per GPU
        slots = {}
        # two sizes: identical asks wait for the first to start (kubelet cannot tell them apart)
        for name, size, pct in (("cuda-sample", 2, 30), ("other", 3, 60)):
            _, admitted = await admit(r, pod(name, size, core=pct))
            envs = admitted.envs["c0"]
            assert envs["GPUSHARE_CORE_LIMIT"] == str(pct)  # visible inside the container
            assert envs["GPUSHARE_CGPU_POLICY"] == "3"
            assert envs["GPUSHARE_MEM_LIMIT"] == str(size * GiB)
            assert envs["LD_PRELOAD"] == PRELOAD
            # the memory and the core answers are merged by kubelet: the mounts come once
            assert [m[0] for m in admitted.mounts["c0"]] == [
                paths.CONTAINER_LIB_DIR,
                paths.CONTAINER_PRELOAD_FILE,
                paths.CONTAINER_LIMITS_FILE,
                paths.CONTAINER_BROKER_DIR,
                paths.CONTAINER_SCHED_DIR,
            ]
            (limits_path,) = [
                h for c, h, _ in admitted.mounts["c0"] if c == paths.CONTAINER_LIMITS_FILE
            ]
            limits = ContainerLimits.parse(Path(limits_path).read_text())
            assert (limits.core_pct, limits.policy) == (pct, int(Policy.FIXED))
            assert limits.mem_limit_bytes == (size * GiB,)
            slots[limits.slot] = pct
        (gpu,) = {g for g in (0, 1) if (r.root / "state" / "sched" / f"gpu{g}").exists()}
        text = (r.root / "state" / "sched" / f"gpu{gpu}").read_text()
        fields = [
            ln.removeprefix("slot=").split(",") for ln in text.splitlines() if ln[:5] == "slot="
        ]
        laid = [(o, int(a), int(b)) for o, a, b in fields]
        assert {o: b * 100 // 100_000_000 for o, _, b in laid} == slots
        (_, a0, l0), (_, a1, _) = sorted(laid, key=lambda x: x[1])
        assert a0 + l0 <= a1  # one after the other, never overlapping

    run(body, mode=Mode.CORE_MEM, hook=isolation(packaged=fake_library()))


def test_identical_pending_containers_get_distinct_accounts() -> None:
    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        first = await r.place(pod("a", 2))
        second = await r.place(pod("b", 2))
        assert first is not None and second is not None
        dirs = set()
        for placed in (first, second):
            admitted = await r.kubelet.admit(placed)
            (host,) = [h for c, h, _ in admitted.mounts["c0"] if c == paths.CONTAINER_BROKER_DIR]
            (limits,) = [h for c, h, _ in admitted.mounts["c0"] if c == paths.CONTAINER_LIMITS_FILE]
            assert (Path(host) / SOCKET_NAME).exists() and Path(limits).is_file()
            dirs.update({Path(host), Path(limits).parent})
        assert len(dirs) == 4

    run(body, mode=Mode.CGPU, hook=isolation(packaged=fake_library()))


def test_share_nodes_get_the_variables_and_nothing_enforced() -> None:
    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        _, admitted = await admit(r, pod("app", 4))
        envs = admitted.envs["c0"]
        assert (envs["ALIYUN_COM_GPU_MEM_CONTAINER"], envs["ALIYUN_COM_GPU_MEM_DEV"]) == ("4", "15")
        assert "LD_PRELOAD" not in envs and "c0" not in admitted.mounts

    run(body, mode=Mode.SHARE, hook=isolation(packaged=fake_library()))


def test_isolation_none_serves_cgpu_without_the_interposer() -> None:
    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        _, admitted = await admit(r, pod("app", 4))
        assert "LD_PRELOAD" not in admitted.envs["c0"] and "c0" not in admitted.mounts

    run(body, mode=Mode.CGPU, hook=isolation(policy="none"))


def checked(packaged: Path | None) -> Any:
    """A hook whose isolated answers name the runtime's mount check (``cdi-cri`` nodes)."""

    def make(root: Path, source: FakeGpus) -> NodeIsolation:
        check = MountCheck(
            spec_dir=root / "cdi",
            lib_dir=root / "lib",
            watched=(root / "state", root / "lib"),
            packaged=packaged,
        )
        return isolation(packaged=fake_library(), mount_check=check)(root, source)

    return make


def fake_program() -> Path:
    path = Path(tempfile.mkdtemp()) / "gpushare-mountcheck"
    path.write_bytes(b"\x7fELF fake hook")
    return path


@pytest.mark.parametrize("mode", [Mode.CGPU, Mode.MPS])
def test_isolated_containers_name_the_mount_check_and_its_spec_is_installed(mode: Mode) -> None:
    program = fake_program()

    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        installed = r.root / "lib" / "gpushare-mountcheck"
        assert installed.read_bytes() == program.read_bytes() and os.access(installed, os.X_OK)
        spec = json.loads((r.root / "cdi" / SPEC_NAME).read_text())
        assert spec["kind"] == "gpushare.io/isolation"
        (device,) = spec["devices"]
        (hook,) = device["containerEdits"]["hooks"]
        assert hook["hookName"] == "createRuntime" and hook["path"] == str(installed)
        assert hook["args"] == ["gpushare-mountcheck", "--under", str(r.root / "state"),
                                "--under", str(r.root / "lib")]  # fmt: skip
        _, admitted = await admit(r, pod("app", 4))
        assert admitted.cdi_devices["c0"].count(DEVICE) == 1
        assert admitted.mounts["c0"]

    run(body, mode=mode, hook=checked(program))


def test_unisolated_containers_are_not_checked() -> None:
    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        _, admitted = await admit(r, pod("app", 4))
        assert DEVICE not in admitted.cdi_devices.get("c0", [])
        assert not (r.root / "cdi" / SPEC_NAME).exists()

    run(body, mode=Mode.SHARE, hook=checked(fake_program()))


def test_cgpu_without_the_mount_check_refuses_to_start(tmp_path: Path) -> None:
    kube = MemoryKube()
    kube.put_node(bare_node(Mode.CGPU))
    source = FakeGpus.parse("1x15GiB", node=NODE)
    config = PluginConfig(node=NODE, plugin_dir=tmp_path / "dp", state_dir=tmp_path / "state")
    plugin = DevicePlugin(
        api=kube, source=source, config=config, hook=checked(None)(tmp_path, source)
    )
    with pytest.raises(StartRefused) as err:
        grpc_loop.run(plugin.start())
    assert "gpushare-mountcheck" in str(err.value) and "gpushare.isolation.build" in str(err.value)


def test_cgpu_without_the_library_refuses_to_start(tmp_path: Path) -> None:
    kube = MemoryKube()
    kube.put_node(bare_node(Mode.CGPU))
    source = FakeGpus.parse("1x15GiB", node=NODE)
    config = PluginConfig(node=NODE, plugin_dir=tmp_path / "dp", state_dir=tmp_path / "state")
    hook = isolation(packaged=None)(tmp_path, source)
    plugin = DevicePlugin(api=kube, source=source, config=config, hook=hook)
    with pytest.raises(StartRefused) as err:
        grpc_loop.run(plugin.start())
    assert LIB_NAME in str(err.value) and "--isolation none" in str(err.value)
    node = grpc_loop.run(kube.get_node(NODE))
    assert "gpushare.io/gpus" not in node["metadata"].get("annotations", {})  # nothing published


def test_mps_starts_one_daemon_per_gpu_lazily_and_injects_its_limits() -> None:
    daemons = FakeDaemons()

    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        assert daemons.starts == []  # lazily
        _, admitted = await admit(r, pod("a", 2))
        index = int(admitted.envs["c0"]["ALIYUN_COM_GPU_MEM_IDX"])
        uuid = f"GPU-fake-{NODE}-{index}"
        pipe = r.root / "state" / "mps" / uuid / "pipe"
        envs = admitted.envs["c0"]
        assert envs["CUDA_MPS_PIPE_DIRECTORY"] == paths.CONTAINER_MPS_PIPE_DIR
        assert envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M"
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in envs
        assert "LD_PRELOAD" not in envs
        assert admitted.mounts["c0"] == [(paths.CONTAINER_MPS_PIPE_DIR, str(pipe), False)]
        assert daemons.starts == [uuid]
        # a second pod on the same GPU reuses the daemon
        second = await r.place(pod("b", 3))
        assert second is not None
        more = await r.kubelet.admit(second)
        if more.envs["c0"]["ALIYUN_COM_GPU_MEM_IDX"] == str(index):
            assert daemons.starts == [uuid]
        assert more.envs["c0"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=3072M"
        # a dead daemon is started again on the next Allocate for its GPU
        daemons.running.clear()
        third = await r.place(pod("c", 1))
        assert third is not None
        last = await r.kubelet.admit(third)
        assert len(daemons.starts) >= 2
        assert daemons.starts[-1].endswith(last.envs["c0"]["ALIYUN_COM_GPU_MEM_IDX"])
        assert set(daemons.starts) <= {f"GPU-fake-{NODE}-{i}" for i in range(2)}

    run(body, mode=Mode.MPS, hook=isolation(daemons=daemons))
    # the plugin stopped: every daemon it started was asked to quit
    assert daemons.running == {} and daemons.stops


def test_accounting_dirs_of_gone_containers_are_pruned_after_the_grace(tmp_path: Path) -> None:
    root = tmp_path / "accounting"
    live_devices = ("GPU-a-mem-0", "GPU-a-mem-1")
    for rel in ("uid-live/c0", "uid-gone/c0", "uid-new/c0"):
        (root / rel).mkdir(parents=True)
    for key in (devices_key(live_devices), devices_key(("GPU-a-mem-7",))):
        (root / BY_DEVICES / key).mkdir(parents=True)
    now = time.time()
    for path in (*root.iterdir(), *(root / BY_DEVICES).iterdir()):
        os.utime(path, (now - 120, now - 120))
    os.utime(root / "uid-new", (now - 5, now - 5))  # admitted after the live lists were read
    removed = prune_accounting(
        root, frozenset({"uid-live"}), frozenset({tuple(sorted(live_devices))}), now=now
    )
    assert sorted(p.relative_to(root).as_posix() for p in removed) == [
        f"{BY_DEVICES}/{devices_key(('GPU-a-mem-7',))}",
        "uid-gone",
    ]
    assert sorted(p.name for p in root.iterdir()) == [BY_DEVICES, "uid-live", "uid-new"]


def test_a_restarted_plugin_serves_the_accounts_again_and_prunes_the_gone(
    tmp_path: Path,
) -> None:
    """Accounts come back from the limits files; those of gone pods are closed and removed.

    ``accounting`` holds the usage tables of plugins from before the broker: pruned alike.
    """
    kinds = ("broker", "limits", "accounting")
    old = time.time() - 120
    for uid in ("uid-live", "uid-gone"):
        for kind in kinds:
            (tmp_path / "state" / kind / uid / "c0").mkdir(parents=True)
        (tmp_path / "state" / "limits" / uid / "c0" / "limits").write_text(limits_text(str(GiB)))
    (tmp_path / "state" / "limits" / "uid-v1" / "c0").mkdir(parents=True)
    (tmp_path / "state" / "limits" / "uid-v1" / "c0" / "limits").write_text(
        "version=1\nmem_limit=1\ncore_limit=0\nunit=1GiB\naccounting_dir=/var/run/gpushare\n"
    )

    async def body() -> None:
        hook = isolation(packaged=fake_library())(tmp_path, FakeGpus.parse("1x15GiB", node=NODE))
        assert hook.prepare(Mode.CGPU) is None
        broker = hook.chosen.broker
        assert broker.served() == ["uid-gone/c0", "uid-live/c0"]  # not the version 1 file's
        sock = tmp_path / "state" / "broker" / "uid-live" / "c0" / SOCKET_NAME
        assert await ask(sock, "hold 0 5", "used 0") == ["ok", f"used 5 {GiB}"]
        for kind in kinds:
            for uid in ("uid-live", "uid-gone", "uid-v1"):
                if (tmp_path / "state" / kind / uid).exists():
                    os.utime(tmp_path / "state" / kind / uid, (old, old))
        hook.prune(frozenset({"uid-live"}), frozenset())
        for kind in kinds:
            assert sorted(p.name for p in (tmp_path / "state" / kind).iterdir()) == ["uid-live"]
        assert broker.served() == ["uid-live/c0"]
        hook.close()
        assert broker.served() == []

    asyncio.run(body())


def test_the_plugin_check_hands_the_live_pods_and_devices_to_the_hook() -> None:
    seen: list[tuple[frozenset[str], frozenset[tuple[str, ...]]]] = []

    class Recording(NodeIsolation):
        def prune(
            self, live_uids: frozenset[str], live_devices: frozenset[tuple[str, ...]]
        ) -> None:
            seen.append((live_uids, live_devices))

    def make(root: Path, source: FakeGpus) -> NodeIsolation:
        return Recording(
            policy="auto",
            lib_dir=root / "lib",
            state_dir=root / "state",
            unit=MemoryUnit.GiB,
            source=source,
            packaged=fake_library(),
        )

    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        placed, admitted = await admit(r, pod("a", 2))
        mine = tuple(sorted(admitted.containers["c0"][MEM]))
        # the fake kubelet lists a pod from the start of its admission, its devices once every
        # Allocate answered: wait for a check that saw both
        for _ in range(100):
            if seen and placed["metadata"]["uid"] in seen[-1][0] and mine in seen[-1][1]:
                break
            await asyncio.sleep(0.05)
        uids, devices = seen[-1]
        assert placed["metadata"]["uid"] in uids
        assert tuple(sorted(admitted.containers["c0"][MEM])) in devices

    run(body, mode=Mode.CGPU, hook=make)


# A stand-in for nvidia-cuda-mps-control (the GPU run's rehearsal uses it too).
FAKE_MPS_CONTROL = (
    Path(__file__).parents[3] / "harness" / "fakegpu" / "fakes" / "nvidia-cuda-mps-control"
).read_text()


def test_the_real_runner_speaks_nvidia_cuda_mps_control(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = MpsControl()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert "nvidia-cuda-mps-control is not on PATH" in runner.missing()
    binary = tmp_path / "bin" / "nvidia-cuda-mps-control"
    binary.parent.mkdir()
    binary.write_text(FAKE_MPS_CONTROL)
    binary.chmod(0o755)
    monkeypatch.setenv("PATH", f"{binary.parent}:/usr/bin:/bin")
    assert runner.missing() is None
    pipe, logs = tmp_path / "pipe", tmp_path / "log"
    pipe.mkdir()
    assert not runner.alive(pipe)
    gpu = GpuInfo(index=1, uuid="GPU-1234", model="H100", memory_mib=81559)
    runner.start(gpu, pipe, logs)
    assert (pipe / "control").read_text().split() == ["GPU-1234", str(logs)]
    assert runner.alive(pipe)
    runner.stop(pipe)
    assert not runner.alive(pipe)
    assert (pipe / "commands").read_text().split() == ["get_server_list", "quit"]


def test_a_cgpu_policy_gives_each_container_a_slot_in_its_gpus_schedule() -> None:
    """Policy 3 (fixed): the limits file names the policy, and the schedule holds the share."""

    def make(root: Path, source: FakeGpus) -> NodeIsolation:
        return NodeIsolation(
            policy="auto",
            lib_dir=root / "lib",
            state_dir=root / "state",
            unit=MemoryUnit.GiB,
            source=source,
            packaged=fake_library(),
            cgpu_policy=Policy.FIXED,
        )

    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        placed, admitted = await admit(r, pod("trainer", 4))
        uid = placed["metadata"]["uid"]
        envs, mounts = admitted.envs["c0"], admitted.mounts["c0"]
        assert envs["GPUSHARE_CGPU_POLICY"] == "3" and "GPUSHARE_CORE_LIMIT" not in envs
        sched = r.root / "state" / "sched"
        assert (paths.CONTAINER_SCHED_DIR, str(sched), True) in mounts
        limits = ContainerLimits.parse(
            (r.root / "state" / "limits" / uid / "c0" / "limits").read_text()
        )
        gpu = limits.gpus[0]
        memory = {g.index: g.memory_mib for g in r.gpus.gpus()}[gpu]
        assert limits.policy == 3 and limits.slot == slot_id(f"{uid}/c0")
        assert limits.core_pct == round(100 * 4 * 1024 / memory)
        text = (sched / f"gpu{gpu}").read_text()
        slot = next(line for line in text.splitlines() if line.startswith("slot="))
        assert slot == f"slot={limits.slot},0,{limits.core_pct * 1_000_000}", text

    run(body, mode=Mode.CGPU, hook=make)


def test_the_device_plugin_refuses_a_policy_outside_0_to_5() -> None:
    from click.testing import CliRunner

    from gpushare.cli import main

    out = CliRunner().invoke(
        main, ["device-plugin", "--node-name", "n"], env={"GPUSHARE_ISOLATION_POLICY": "7"}
    )
    assert out.exit_code == 2
    assert "GPUSHARE_ISOLATION_POLICY)='7' is not a cGPU policy" in out.output


def weighted_pod(name: str, size: int, weight: str | None, *, from_field: bool = False) -> Any:
    """A pod whose container sets ALIYUN_COM_GPU_SCHD_WEIGHT in its spec (or not at all)."""
    manifest = pod(name, size)
    if weight is not None:
        entry: dict[str, Any] = {"name": WEIGHT_ENV, "value": weight}
        if from_field:
            entry = {"name": WEIGHT_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
        manifest["spec"]["containers"][0]["env"] = [entry]
    return manifest


def cgpu_hook(policy: Policy, max_pods: int | None = None) -> Any:
    def make(root: Path, source: FakeGpus) -> NodeIsolation:
        return NodeIsolation(
            policy="auto",
            lib_dir=root / "lib",
            state_dir=root / "state",
            unit=MemoryUnit.GiB,
            source=source,
            packaged=fake_library(),
            cgpu_policy=policy,
            max_pods=max_pods,
        )

    return make


def slots(sched: Path) -> dict[str, int]:
    """Each owner's slot length in a schedule file."""
    out = {}
    for line in sched.read_text().splitlines():
        if line.startswith("slot="):
            owner, _, length = line.removeprefix("slot=").split(",")
            out[owner] = int(length)
    return out


def test_policy_2_weights_come_from_the_pod_spec_and_shares_from_activity(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Weights 3 and a bad one (1 used, said); only containers reporting activity get time."""

    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        hook = r.plugin.hook.chosen  # type: ignore[attr-defined]
        now = [1000.0]
        hook.clock = lambda: now[0]
        keys, limits = [], []
        for name, weight in (("heavy", "3"), ("odd", "99"), ("plain", None)):
            placed, _ = await admit(r, weighted_pod(name, 2, weight))
            # served, so out of the hand-off: the next pod is the only candidate for its answer
            assert await served(r, name)
            key = f"{placed['metadata']['uid']}/c0"
            keys.append(key)
            text = (r.root / "state" / "limits" / key / "limits").read_text()
            limits.append(ContainerLimits.parse(text))
        assert [x.weight for x in limits] == [3, 1, 1]
        assert "ALIYUN_COM_GPU_SCHD_WEIGHT='99' is not a scheduling weight" in caplog.text
        assert "from 1 to 20" in caplog.text and "pod default/odd container c0" in caplog.text
        by_gpu: dict[int, list[int]] = {}
        for i, x in enumerate(limits):
            by_gpu.setdefault(x.gpus[0], []).append(i)
        gpu, shared = max(by_gpu.items(), key=lambda kv: len(kv[1]))
        assert len(shared) >= 2, by_gpu
        sched = r.root / "state" / "sched" / f"gpu{gpu}"
        assert slots(sched) == {}  # nobody has launched yet
        for i in shared:
            hook.note_active(keys[i], 0)
        got = slots(sched)
        total = sum(limits[i].weight for i in shared)
        assert got == {limits[i].slot: limits[i].weight * 100_000_000 // total for i in shared}, got
        # the first stays busy; the others fall silent for longer than IDLE_AFTER_S
        now[0] += IDLE_AFTER_S + 0.1
        hook.note_active(keys[shared[0]], 0)
        assert slots(sched) == {limits[shared[0]].slot: 100_000_000}
        # a device ordinal the container does not have, and an unknown key, change nothing
        hook.note_active(keys[shared[1]], 5)
        hook.note_active("nobody/c0", 0)
        assert slots(sched) == {limits[shared[0]].slot: 100_000_000}

    run(body, mode=Mode.CGPU, hook=cgpu_hook(Policy.WEIGHTED))


def test_a_weight_from_value_from_is_not_read() -> None:
    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        placed, _ = await admit(r, weighted_pod("ref", 2, "4", from_field=True))
        key = f"{placed['metadata']['uid']}/c0"
        text = (r.root / "state" / "limits" / key / "limits").read_text()
        assert ContainerLimits.parse(text).weight == 1

    run(body, mode=Mode.CGPU, hook=cgpu_hook(Policy.WEIGHTED))


def test_policy_0_gives_one_over_the_max_pods_the_plugin_is_given() -> None:
    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        placed, _ = await admit(r, pod("even", 2))
        key = f"{placed['metadata']['uid']}/c0"
        limits = ContainerLimits.parse((r.root / "state" / "limits" / key / "limits").read_text())
        sched = r.root / "state" / "sched" / f"gpu{limits.gpus[0]}"
        assert slots(sched) == {limits.slot: 100_000_000 // 8}

    run(body, mode=Mode.CGPU, hook=cgpu_hook(Policy.EVEN, max_pods=8))


def test_the_device_plugin_refuses_max_pods_outside_1_to_64() -> None:
    from click.testing import CliRunner

    from gpushare.cli import main

    out = CliRunner().invoke(
        main, ["device-plugin", "--node-name", "n"], env={"GPUSHARE_MAX_PODS_PER_GPU": "65"}
    )
    assert out.exit_code == 2
    assert "--max-pods-per-gpu='65' is not a pod count per GPU" in out.output


def test_pods_created_together_get_their_own_weights_once_kubelet_names_them() -> None:
    """Allocate gives the lowest weight of the pods it may be admitting; the served-check, which
    learns from PodResources which pod got which devices, gives each its own."""

    async def body(r: Rig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        hook = r.plugin.hook.chosen  # type: ignore[attr-defined]
        light = await r.place(weighted_pod("light", 2, "1"))
        heavy = await r.place(weighted_pod("heavy", 2, "3"))
        assert light is not None and heavy is not None
        await r.kubelet.admit(heavy)  # while light still waits: two candidates, 1 and 3
        await r.kubelet.admit(light)
        assert await served(r, "light") and await served(r, "heavy")
        weights = {
            member.weight for members in hook.members.values() for member in members.values()
        }
        assert weights == {1, 3}, hook.members
        text = "".join((r.root / "state" / "sched" / f"gpu{g}").read_text() for g in hook.members)
        assert ",3,0" in text and ",1,0" in text, text  # member=<slot>,<weight>,<active>

    run(body, mode=Mode.CGPU, hook=cgpu_hook(Policy.WEIGHTED))
