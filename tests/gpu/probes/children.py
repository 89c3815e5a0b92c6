"""The programs a step starts under the interposer, one per probe; each prints one JSON line.

``python -m tests.gpu.probes.children PROBE ARGS...``. The ``driver_*``, ``nvml_*``, ``vmm`` and
``managed`` probes call the driver API through ctypes (the library named by
``GPUSHARE_GPU_CUDA``, the real ``libcuda.so.1`` or the fake driver): they run in both modes.
The others need PyTorch, CuPy or JAX and run on a GPU only. A holder (``*_hold``) allocates,
prints its JSON, then waits for stdin to close (or for SIGKILL). Every CUDA call's result is
reported, never assumed: an exit code of 0 proves nothing.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

MiB = 2**20
OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY
Probe = Callable[[list[str]], dict[str, Any]]
PROBES: dict[str, Probe] = {}


def probe(fn: Probe) -> Probe:
    PROBES[fn.__name__] = fn
    return fn


# ------------------------------------------------------------------ the driver API, through ctypes


def limit_figures(free: int, total: int, at_limit: object, one_more: object) -> dict[str, Any]:
    """What every limit probe reports: the memory query, then the limit and one MiB more
    (a CUresult through the driver, ``allocated`` or ``oom`` through a framework)."""
    return {"free": free, "total": total, "at_limit": at_limit, "one_mib_more": one_more}


class Driver:
    """The few driver calls the probes make, with their C signatures."""

    def __init__(self) -> None:
        self.cu = ctypes.CDLL(os.environ.get("GPUSHARE_GPU_CUDA", "libcuda.so.1"))
        size_t, ptr = ctypes.c_size_t, ctypes.POINTER
        for name, args in {
            "cuMemAlloc_v2": [ptr(ctypes.c_ulonglong), size_t],
            "cuMemFree_v2": [ctypes.c_ulonglong],
            "cuMemGetInfo_v2": [ptr(size_t), ptr(size_t)],
            "cuMemAllocManaged": [ptr(ctypes.c_ulonglong), size_t, ctypes.c_uint],
        }.items():
            getattr(self.cu, name).argtypes = args
        self.ok(self.cu.cuInit(0), "cuInit")
        dev = ctypes.c_int()
        self.ok(self.cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
        ctx = ctypes.c_void_p()
        self.ok(
            self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain"
        )
        self.ok(self.cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    @staticmethod
    def ok(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} returned CUresult {rc}")

    def alloc(self, size: int) -> tuple[int, int]:
        """(CUresult, pointer)."""
        p = ctypes.c_ulonglong()
        return self.cu.cuMemAlloc_v2(ctypes.byref(p), size), p.value

    def info(self) -> tuple[int, int]:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.ok(self.cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
        return free.value, total.value


@probe
def driver_limit(args: list[str]) -> dict[str, Any]:
    """cuMemGetInfo, then the limit in one allocation, then one MiB more."""
    limit = int(args[0])
    d = Driver()
    free, total = d.info()
    rc_limit, p = d.alloc(limit)
    rc_more, q = d.alloc(MiB)
    for ptr in (p, q):
        if ptr:
            d.cu.cuMemFree_v2(ptr)
    return limit_figures(free, total, rc_limit, rc_more)


@probe
def driver_hold(args: list[str]) -> dict[str, Any]:
    d = Driver()
    rc, _ = d.alloc(int(args[0]))
    return {"held_rc": rc}


@probe
def driver_try(args: list[str]) -> dict[str, Any]:
    d = Driver()
    free, total = d.info()
    rc, p = d.alloc(int(args[0]))
    if p:
        d.cu.cuMemFree_v2(p)
    return {"free": free, "total": total, "alloc_rc": rc}


@probe
def managed(args: list[str]) -> dict[str, Any]:
    """cuMemAllocManaged of 1 MiB (never more: managed memory beyond the free can hang a GPU)."""
    d = Driver()
    p = ctypes.c_ulonglong()
    rc = d.cu.cuMemAllocManaged(ctypes.byref(p), MiB, 1)
    if p.value:
        d.cu.cuMemFree_v2(p.value)
    return {"managed_rc": rc}


class _Prop(ctypes.Structure):
    """CUmemAllocationProp: pinned device memory on device 0."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("handles", ctypes.c_int),
        ("loc_type", ctypes.c_int),
        ("loc_id", ctypes.c_int),
        ("win32", ctypes.c_void_p),
        ("flags", ctypes.c_ubyte * 8),
    ]


@probe
def vmm(args: list[str]) -> dict[str, Any]:
    """cuMemCreate of half the limit, then of the limit (over it), map, release, again."""
    limit = int(args[0])
    d = Driver()
    cu = d.cu
    ull, size_t = ctypes.c_ulonglong, ctypes.c_size_t
    prop = _Prop(1, 0, 1, 0)
    gran = size_t()
    d.ok(cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 0), "granularity")
    half = (limit // 2 // gran.value) * gran.value
    h1, h2 = ull(), ull()
    first = cu.cuMemCreate(ctypes.byref(h1), size_t(half), ctypes.byref(prop), ull(0))
    over = cu.cuMemCreate(ctypes.byref(h2), size_t(limit), ctypes.byref(prop), ull(0))
    va = ull()
    d.ok(
        cu.cuMemAddressReserve(ctypes.byref(va), size_t(half), size_t(0), ull(0), ull(0)), "reserve"
    )
    mapped = cu.cuMemMap(va, size_t(half), size_t(0), h1, ull(0))
    cu.cuMemUnmap(va, size_t(half))
    cu.cuMemAddressFree(va, size_t(half))
    released = cu.cuMemRelease(h1)
    again = cu.cuMemCreate(ctypes.byref(h2), size_t(limit), ctypes.byref(prop), ull(0))
    if again == 0:
        cu.cuMemRelease(h2)
    return {
        "granularity": gran.value,
        "create_half_rc": first,
        "create_limit_while_half_held_rc": over,
        "map_rc": mapped,
        "release_rc": released,
        "create_limit_after_release_rc": again,
    }


class _Memory(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


@probe
def nvml_memory(args: list[str]) -> dict[str, Any]:
    """nvmlDeviceGetMemoryInfo of device 0, through the preload, as nvidia-smi calls it."""
    nvml = ctypes.CDLL(os.environ.get("GPUSHARE_GPU_NVML", "libnvidia-ml.so.1"))
    Driver.ok(nvml.nvmlInit_v2(), "nvmlInit_v2")
    handle = ctypes.c_void_p()
    Driver.ok(nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)), "handle")
    mem = _Memory()
    Driver.ok(nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)), "nvmlDeviceGetMemoryInfo")
    return {"total": mem.total, "used": mem.used, "free": mem.free}


# ------------------------------------------------------------------ PyTorch


def _torch() -> Any:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("PyTorch sees no CUDA device")
    return torch


def _torch_alloc(torch: Any, size: int) -> tuple[str, Any]:
    try:
        x = torch.empty(size, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        return "allocated", x
    except torch.cuda.OutOfMemoryError:
        return "oom", None


@probe
def torch_limit(args: list[str]) -> dict[str, Any]:
    """mem_get_info, the limit in one tensor, then one MiB more (PYTORCH_CUDA_ALLOC_CONF as set)."""
    torch = _torch()
    limit = int(args[0])
    free, total = torch.cuda.mem_get_info()
    at_limit, x = _torch_alloc(torch, limit)
    one_more, _ = _torch_alloc(torch, MiB)
    del x
    return {
        "torch": torch.__version__,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        **limit_figures(free, total, at_limit, one_more),
    }


@probe
def torch_hold(args: list[str]) -> dict[str, Any]:
    torch = _torch()
    held, x = _torch_alloc(torch, int(args[0]))
    globals()["_held"] = x
    return {"held": held}


@probe
def torch_try(args: list[str]) -> dict[str, Any]:
    torch = _torch()
    free, total = torch.cuda.mem_get_info()
    got, _ = _torch_alloc(torch, int(args[0]))
    return {"free": free, "total": total, "alloc": got}


@probe
def torch_fill(args: list[str]) -> dict[str, Any]:
    """Tensors of STEP MiB until out of memory (or MAX MiB): how much a client really gets."""
    torch = _torch()
    step, most = int(args[0]) * MiB, int(args[1]) * MiB
    free, total = torch.cuda.mem_get_info()
    held = []
    while len(held) * step < most:
        got, x = _torch_alloc(torch, step)
        if got != "allocated":
            break
        held.append(x)
    props = torch.cuda.get_device_properties(0)
    return {
        "free": free,
        "total": total,
        "filled": len(held) * step,
        "multi_processors": props.multi_processor_count,
    }


@probe
def matmul(args: list[str]) -> dict[str, Any]:
    """4096² fp16 matmuls, a sync every 10, for SECONDS; the rate per WINDOW (matmuls/s).

    With a third argument ``sync``, it says ``{"ready": true}`` once warm and waits for a line
    on stdin, so that processes started together measure the same stretch of time.
    """
    torch = _torch()
    seconds, window = float(args[0]), float(args[1])
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
    if args[2:] == ["sync"]:
        print(json.dumps({"ready": True}), flush=True)
        sys.stdin.readline()
    t0 = time.perf_counter()
    edges, counts, n = [t0 + window], [0], 0
    while (now := time.perf_counter()) - t0 < seconds:
        while now >= edges[-1]:
            edges.append(edges[-1] + window)
            counts.append(0)
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()
        counts[-1] += 10
        n += 10
    rates = [c / window for c in counts[: int(seconds / window)]]
    return {"per_s": n / (time.perf_counter() - t0), "window_s": window, "rates": rates}


@probe
def launches(args: list[str]) -> dict[str, Any]:
    """REPS timings of COUNT tiny kernels (x.add_(1) on 16 floats), after 1,000 warm-up launches."""
    if cpu := os.environ.get("GPUSHARE_GPU_PIN"):  # one core for every run: less noise
        os.sched_setaffinity(0, {int(cpu)})
    torch = _torch()
    count, reps = int(args[0]), int(args[1])
    x = torch.zeros(16, device="cuda")
    for _ in range(1000):
        x.add_(1)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(count):
            x.add_(1)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return {"count": count, "seconds": times}


@probe
def launch_batches(args: list[str]) -> dict[str, Any]:
    """Batches of tiny launches on demand: ``torch`` (x.add_(1) on 16 floats) or ``driver``
    (cuLaunchKernel of the fake driver's kernel, the rehearsal). Warm-up of WARM launches, then
    says ``{"ready": true}``; each line ``COUNT`` on stdin is answered with the batch's seconds
    (wall clock from the first launch to the synchronize after the last). Ends at end of input.
    Long-lived, so that runs compared with each other share no process start. Pinned to one
    core (``GPUSHARE_GPU_PIN``) once warm, so that the variants' imports run side by side."""
    kind, warm = args[0], int(args[1])
    if kind == "torch":
        torch = _torch()
        x = torch.zeros(16, device="cuda")

        def batch(n: int) -> None:
            for _ in range(n):
                x.add_(1)
            torch.cuda.synchronize()

    else:
        d = Driver()
        launch, sync = d.cu.cuLaunchKernel, d.cu.cuCtxSynchronize
        vp, uint = ctypes.c_void_p, ctypes.c_uint
        launch.argtypes = [vp, uint, uint, uint, uint, uint, uint, uint, vp, vp, vp]

        def batch(n: int) -> None:
            for _ in range(n):
                launch(1, 1, 1, 1, 1, 1, 1, 0, None, None, None)
            sync()

    batch(warm)
    if cpu := os.environ.get("GPUSHARE_GPU_PIN"):
        os.sched_setaffinity(0, {int(cpu)})
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        t = time.perf_counter()
        batch(int(line))
        print(json.dumps({"seconds": time.perf_counter() - t}), flush=True)
    return {"done": True}


@probe
def spin(args: list[str]) -> dict[str, Any]:
    """Kernels of MS milliseconds each (``torch.cuda._sleep``, a clock64 spin) for SECONDS.

    The cycles per millisecond are measured first with CUDA events on one long spin, or given as
    a third argument (measured unlimited: under a limit the wait before a held launch would
    count as spinning). Each kernel
    is synchronised before the next, so the share taken is the kernels' time over the wall time
    of the second half of the run (``share_pct``)."""
    torch = _torch()
    ms, seconds = float(args[0]), float(args[1])
    if args[2:]:
        per_ms = float(args[2])
    else:
        probe_cycles = 50_000_000
        torch.cuda._sleep(1000)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(probe_cycles)
        end.record()
        torch.cuda.synchronize()
        per_ms = probe_cycles / start.elapsed_time(end)
    cycles = int(per_ms * ms)
    t0 = time.perf_counter()
    half, kernels, n = t0 + seconds / 2, [], 0
    half_wall = time.time() + seconds / 2
    while (now := time.perf_counter()) - t0 < seconds:
        torch.cuda._sleep(cycles)
        torch.cuda.synchronize()
        n += 1
        if now >= half:
            kernels.append(time.perf_counter() - now)
    span = time.perf_counter() - half
    return {
        "ms": ms,
        "cycles_per_ms": round(per_ms),
        "kernels": n,
        "kernel_ms_median": round(1000 * sorted(kernels)[len(kernels) // 2], 2)
        if kernels
        else None,
        "share_pct": round(100 * len(kernels) * ms / 1000 / span, 1) if span > 0 else None,
        "second_half_wall": [half_wall, time.time()],
    }


@probe
def torch_workload(args: list[str]) -> dict[str, Any]:
    """One of the workloads for SECONDS: ``graphs`` (inference replayed from a CUDA graph),
    ``compile`` (``torch.compile``, mode reduce-overhead), ``expandable`` (inference with
    PYTORCH_CUDA_ALLOC_CONF as set, then tensors of 256 MiB until out of memory), ``amp`` (a
    bf16 autocast training loop). Seeded and deterministic, so its ``checksum`` compares with
    the same run unlimited; ``per_s`` is its iterations a second over the timed loop, whose wall
    times (``loop_wall``) say where to read NVML. With a third argument ``sync`` it says
    ``{"ready": true}`` before the timed loop and waits for a line on stdin, so that processes
    started together time the same stretch."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS, deterministic
    torch = _torch()
    kind, seconds = args[0], float(args[1])
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    model = torch.nn.Sequential(
        torch.nn.Linear(2048, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 2048)
    ).cuda()
    x = torch.randn(256, 2048, device="cuda")
    result: dict[str, Any] = {"torch": torch.__version__, "kind": kind}
    if kind == "amp":
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        target = torch.randn(256, 2048, device="cuda")

        def step() -> Any:
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.mse_loss(model(x).float(), target)
            loss.backward()
            opt.step()
            return loss

        fixed = 50  # the checksum's steps: the same number limited and not
    else:
        model.eval()
        if kind == "graphs":
            static = x.clone()
            with torch.no_grad():
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(3):
                        model(static)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    out = model(static)

            def step() -> Any:
                graph.replay()
                return out

        else:
            fn = torch.compile(model, mode="reduce-overhead") if kind == "compile" else model

            def step() -> Any:
                with torch.no_grad():
                    return fn(x)

        fixed = 1
    for _ in range(fixed):
        got = step()
    torch.cuda.synchronize()
    result["checksum"] = float(got.double().sum().item())
    if args[2:] == ["sync"]:
        print(json.dumps({"ready": True}), flush=True)
        sys.stdin.readline()
    wall, t0, n = time.time(), time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            step()
        torch.cuda.synchronize()
        n += 10
    result["per_s"] = round(n / (time.perf_counter() - t0), 2)
    result["loop_wall"] = [wall, time.time()]
    result["peak_bytes"] = torch.cuda.max_memory_reserved()
    if kind == "expandable" and os.environ.get("GPUSHARE_MEM_LIMIT"):
        _, total = torch.cuda.mem_get_info()
        held = []
        while True:
            ok, t = _torch_alloc(torch, 256 * MiB)
            if ok != "allocated":
                break
            held.append(t)
        result.update(
            alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
            total=total,
            reserved_at_oom=torch.cuda.memory_reserved(),
        )
        del held
    return result


@probe
def share_helper(args: list[str]) -> dict[str, Any]:
    """gpushare.isolation.share.apply() with a container's ALIYUN_* variables, then allocate."""
    torch = _torch()
    from gpushare.isolation import share

    _, total = torch.cuda.mem_get_info()
    os.environ.setdefault("ALIYUN_COM_GPU_MEM_DEV", str(total // 2**30))
    applied = share.apply()
    container = int(os.environ["ALIYUN_COM_GPU_MEM_CONTAINER"]) * 2**30
    half, x = _torch_alloc(torch, container // 2)
    over, _ = _torch_alloc(torch, container)
    del x
    return {"applied": repr(applied), "half_of_share": half, "whole_share_more": over}


# ------------------------------------------------------------------ CuPy and JAX


@probe
def cupy_limit(args: list[str]) -> dict[str, Any]:
    """The limit in one array and one MiB more, with CuPy's default pool or its async pool."""
    import cupy

    limit, pool = int(args[0]), args[1]
    if pool == "async":
        cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)
    free, total = cupy.cuda.runtime.memGetInfo()

    def alloc(size: int) -> tuple[str, Any]:
        try:
            return "allocated", cupy.empty(size, dtype=cupy.uint8)
        except cupy.cuda.memory.OutOfMemoryError:
            return "oom", None

    at_limit, x = alloc(limit)
    one_more, _ = alloc(MiB)
    del x
    return {
        "cupy": cupy.__version__,
        "pool": pool,
        **limit_figures(free, total, at_limit, one_more),
    }


@probe
def jax_prealloc(args: list[str]) -> dict[str, Any]:
    """What JAX preallocates under the limit, and whether an array over it is refused."""
    import jax
    import jax.numpy as jnp

    limit = int(args[0])
    dev = jax.devices()[0]
    stats = dev.memory_stats() or {}
    small = jnp.ones(limit // 4, dtype=jnp.uint8).block_until_ready()
    try:
        jnp.ones(limit, dtype=jnp.uint8).block_until_ready()
        over = "allocated"
    except Exception as err:  # XlaRuntimeError: RESOURCE_EXHAUSTED
        over = f"refused: {type(err).__name__}: {str(err)[:160]}"
    del small
    return {
        "jax": jax.__version__,
        "device": str(dev),
        "bytes_limit": stats.get("bytes_limit"),
        "bytes_reserved": stats.get("bytes_reserved"),
        "quarter_of_limit": "allocated",
        "limit_more": over,
    }


def main(argv: list[str]) -> int:
    name, args = argv[0], argv[1:]
    try:
        result = PROBES[name](args)
    except Exception as err:
        print(json.dumps({"error": f"{type(err).__name__}: {err}"[:400]}), flush=True)
        return 1
    print(json.dumps(result), flush=True)
    if name.endswith("_hold"):
        sys.stdin.read()  # hold until the step closes stdin or kills us
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
