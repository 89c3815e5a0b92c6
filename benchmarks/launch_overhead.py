"""The interposer's own cost per kernel launch, without a GPU.

On the H100 the 50,000-launch probe of ``tests/gpu/run_on_gpu.sh`` could not resolve 3 %: the
same plain run took 0.33 to 0.60 s from one try to the next (pinned to one core or not), twenty
times the goal. This measures what the preload adds to a launch directly: a C program calls
``cuLaunchKernel`` in a loop against a stub driver whose launch returns at once, with and
without ``LD_PRELOAD`` of the interposer (no limit; a memory limit; a core limit on a 100 %
slice, so its gate is crossed without waiting). Runs alternate, and each case's fastest counts.
The nanoseconds added, over what a launch costs on the GPU (about 7 µs per ``x.add_(1)`` there),
are the overhead. Needs gcc.

    python benchmarks/launch_overhead.py [--launches 2000000] [--runs 7] [--gpu-launch-us 7.0]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from gpushare.isolation.build import build, compile_shared, compiler  # noqa: E402

STUB = r"""
typedef int CUresult;
CUresult cuInit(unsigned int flags) { (void)flags; return 0; }
CUresult cuCtxGetDevice(int *dev) { *dev = 0; return 0; }
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shmem, void *stream, void **params,
                        void **extra) {
    (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem;
    (void)stream, (void)params, (void)extra;
    return 0;
}
"""

LOOP = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
typedef int (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void *, void **, void **);
int main(int argc, char **argv) {
    long n = atol(argv[1]);
    void *h = dlopen(argv[2], RTLD_NOW);
    /* as the CUDA runtime does: the driver's handle, then its entry point by name; the
     * interposer wraps dlsym, so a preloaded one hands out its own */
    launch_t launch = h ? (launch_t)dlsym(h, "cuLaunchKernel") : NULL;
    if (launch == NULL) { fprintf(stderr, "no cuLaunchKernel: %s\n", dlerror()); return 1; }
    for (long i = 0; i < 1000; i++) launch(0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) launch(0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.2f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n);
    return 0;
}
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launches", type=int, default=2_000_000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--gpu-launch-us", type=float, default=7.0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gs-launch-"))
    (work / "stub.c").write_text(STUB)
    (work / "loop.c").write_text(LOOP)
    stub = compile_shared([work / "stub.c"], work / "libcuda.so.1", libs=())
    loop = work / "loop"
    subprocess.run([compiler(), "-O2", "-o", str(loop), str(work / "loop.c"), "-ldl"], check=True)
    lib = build(work / "lib" / "libgpushare-cuda.so")
    base = {"PATH": os.environ.get("PATH", ""), "GPUSHARE_REAL_CUDA": str(stub)}
    preload = {**base, "LD_PRELOAD": str(lib)}
    cases = {
        "plain": base,
        "preload, no limit": preload,
        "preload, 8 GiB limit": {**preload, "GPUSHARE_MEM_LIMIT": str(8 * 2**30)},
        "preload, 99 % core slice": {**preload, "GPUSHARE_CORE_LIMIT": "99"},
    }
    best: dict[str, float] = {}
    for run in range(args.runs):
        for name, env in cases.items():
            out = subprocess.run(
                [str(loop), str(args.launches), str(stub)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            best[name] = min(best.get(name, float("inf")), float(out))
        print(f"run {run + 1}/{args.runs} done", file=sys.stderr, flush=True)
    plain = best["plain"]
    gpu = f"of a {args.gpu_launch_us:g} µs GPU launch"
    print(f"| case | ns per launch (fastest of {args.runs}) | added | {gpu} |")
    print("| --- | --- | --- | --- |")
    for name, ns in best.items():
        added = ns - plain
        share = 100 * added / (args.gpu_launch_us * 1000)
        print(f"| {name} | {ns:.1f} | {added:+.1f} ns | {share:.2f} % |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
