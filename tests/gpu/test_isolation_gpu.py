"""On a machine with an NVIDIA GPU: the interposer under real workloads (PyTorch, ctypes, smi).

Each check runs a fresh Python (or nvidia-smi) with ``LD_PRELOAD`` = the interposer built into a
temporary directory, a 2 GiB limit and its own accounting directory, and prints its numbers
(``pytest -s tests/gpu`` shows them). Skipped where NVML finds no GPU (every CI run), and the
PyTorch checks where torch is not importable.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpushare.isolation import build

from .test_nvml import nvml_or_skip

GiB = 2**30
LIMIT = 2 * GiB

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def interposer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    nvml_or_skip()
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found: cannot build the interposer")
    return build.build(tmp_path_factory.mktemp("native") / build.LIB_NAME)


def torch_or_skip() -> None:
    try:
        import torch
    except ImportError as err:
        pytest.skip(f"PyTorch not importable: {err}")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")


def env_for(lib: Path, accounting: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")}
    env.update(
        LD_PRELOAD=str(lib),
        GPUSHARE_MEM_LIMIT=str(LIMIT),
        GPUSHARE_ACCOUNTING_DIR=str(accounting),
        **extra,
    )
    return env


def run_py(code: str, env: dict[str, str], timeout: float = 300) -> dict[str, object]:
    """Run code in a fresh interpreter; it prints one JSON object as its last line."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


ALLOC = """
import json, torch
free, total = torch.cuda.mem_get_info()
x = torch.empty(int(1.5 * 2**30), dtype=torch.uint8, device="cuda")
try:
    y = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    beyond = "allocated"
except torch.cuda.OutOfMemoryError:
    beyond = "oom"
print(json.dumps({"free": free, "total": total, "beyond": beyond}))
"""


def test_pytorch_allocates_up_to_the_limit_and_not_beyond(interposer: Path, tmp_path: Path) -> None:
    torch_or_skip()
    out = run_py(ALLOC, env_for(interposer, tmp_path))
    print("PyTorch under a 2 GiB limit:", out)
    assert out["total"] == LIMIT  # torch.cuda.mem_get_info() shows the limit
    assert out["beyond"] == "oom"


def test_two_processes_share_one_limit(interposer: Path, tmp_path: Path) -> None:
    torch_or_skip()
    env = env_for(interposer, tmp_path)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import torch,sys; x=torch.empty(int(1.5*2**30),dtype=torch.uint8,device='cuda');"
            "torch.cuda.synchronize(); print('held', flush=True); sys.stdin.read()",
        ],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        out = run_py(
            """
            import json, torch
            free, total = torch.cuda.mem_get_info()
            try:
                torch.empty(2**30, dtype=torch.uint8, device="cuda"); r = "allocated"
            except torch.cuda.OutOfMemoryError:
                r = "oom"
            print(json.dumps({"free": free, "total": total, "second": r}))
            """,
            env,
        )
    finally:
        holder.kill()
        holder.wait(timeout=30)
    print("second process while the first holds 1.5 GiB:", out)
    assert out["second"] == "oom"
    assert int(out["free"]) <= LIMIT - int(1.5 * GiB)  # type: ignore[call-overload]


def test_nvidia_smi_shows_the_limit(interposer: Path, tmp_path: Path) -> None:
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi not found")
    done = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.total,memory.used", "--format=csv,noheader,nounits"],
        env=env_for(interposer, tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    print("nvidia-smi under the preload (MiB total, used):", done.stdout.strip())
    assert int(done.stdout.splitlines()[0].split(",")[0]) == LIMIT // 2**20


MATMUL = """
import json, time, torch
a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
for _ in range(20):
    a @ a
torch.cuda.synchronize()
t = time.perf_counter(); n = 0
while time.perf_counter() - t < 8:
    for _ in range(10):
        a @ a
    torch.cuda.synchronize(); n += 10
print(json.dumps({"per_s": n / (time.perf_counter() - t)}))
"""


def test_matmul_throughput_follows_the_core_limit(interposer: Path, tmp_path: Path) -> None:
    torch_or_skip()
    base = float(run_py(MATMUL, env_for(interposer, tmp_path))["per_s"])  # type: ignore[arg-type]
    for target in (30, 60):
        env = env_for(interposer, tmp_path, GPUSHARE_CORE_LIMIT=str(target))
        got = float(run_py(MATMUL, env)["per_s"])  # type: ignore[arg-type]
        ratio = 100 * got / base
        print(f"matmul at GPUSHARE_CORE_LIMIT={target}: {ratio:.1f}% of unthrottled {base:.1f}/s")
        assert abs(ratio - target) <= 15


LAUNCHES = """
import json, time, torch
x = torch.zeros(16, device="cuda")
for _ in range(1000):
    x.add_(1)
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(50000):
    x.add_(1)
torch.cuda.synchronize()
print(json.dumps({"s": time.perf_counter() - t}))
"""


def test_launch_overhead_of_the_interposer(interposer: Path, tmp_path: Path) -> None:
    torch_or_skip()
    plain_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")}
    plain_env.pop("LD_PRELOAD", None)
    plain = min(float(run_py(LAUNCHES, plain_env)["s"]) for _ in range(3))  # type: ignore[arg-type]
    env = env_for(interposer, tmp_path)
    pre = min(float(run_py(LAUNCHES, env)["s"]) for _ in range(3))  # type: ignore[arg-type]
    print(f"50000 small launches: {plain:.3f}s plain, {pre:.3f}s preloaded: x{pre / plain:.3f}")
    assert pre / plain < 1.10  # target 1.03


VMM = """
import ctypes, json
cu = ctypes.CDLL("libcuda.so.1")
def ok(rc, what):
    assert rc == 0, (what, rc)
ok(cu.cuInit(0), "cuInit")
dev = ctypes.c_int(); ok(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = ctypes.c_void_p(); ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
class Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("handles", ctypes.c_int), ("loc_type", ctypes.c_int),
                ("loc_id", ctypes.c_int), ("win32", ctypes.c_void_p), ("flags", ctypes.c_ubyte * 8)]
prop = Prop(1, 0, 1, 0)
gran = ctypes.c_size_t()
ok(cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 0), "granularity")
g = gran.value
size = (2**30 // g) * g
h1, h2 = ctypes.c_ulonglong(), ctypes.c_ulonglong()
first = cu.cuMemCreate(ctypes.byref(h1), ctypes.c_size_t(size), ctypes.byref(prop), 0)
second = cu.cuMemCreate(ctypes.byref(h2), ctypes.c_size_t(2 * size), ctypes.byref(prop), 0)
va = ctypes.c_ulonglong()
ok(cu.cuMemAddressReserve(ctypes.byref(va), ctypes.c_size_t(size), ctypes.c_size_t(0),
                          ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)), "reserve")
mapped = cu.cuMemMap(va, ctypes.c_size_t(size), ctypes.c_size_t(0), h1, ctypes.c_ulonglong(0))
cu.cuMemUnmap(va, ctypes.c_size_t(size))
cu.cuMemAddressFree(va, ctypes.c_size_t(size))
released = cu.cuMemRelease(h1)
third = cu.cuMemCreate(ctypes.byref(h2), ctypes.c_size_t(2 * size), ctypes.byref(prop), 0)
print(json.dumps({"first": first, "second": second, "mapped": mapped, "released": released,
                  "after_release": third}))
"""


def test_vmm_cuMemCreate_and_cuMemMap_through_the_interposer(
    interposer: Path, tmp_path: Path
) -> None:
    out = run_py(VMM, env_for(interposer, tmp_path))
    print("VMM under a 2 GiB limit (1 GiB, then 2 GiB more):", out)
    assert out["first"] == 0 and out["mapped"] == 0 and out["released"] == 0
    assert out["second"] == 2  # CUDA_ERROR_OUT_OF_MEMORY: 1 + 2 GiB > 2 GiB
    assert out["after_release"] == 0
