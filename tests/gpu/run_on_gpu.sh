#!/usr/bin/env bash
# Issue 61's GPU run in one call (issue 37's steps after it), most valuable first:
#   node       the device plugin on the machine's NVML before the kubelet double: what it publishes
#              (devices, units, health, labels), Allocate for a 2 GiB pod and a 30 % core_mem pod,
#              and a process started with each answer held to 2 GiB and to 30 +- 5 %;
#   workloads  CUDA graphs, torch.compile (reduce-overhead), expandable segments, a bf16 training
#              loop, two processes in one container, under 8 GiB and 50 %: same results, limits, shares;
#   overhead   50,000 tiny launches, plain and preloaded, by interleaved rounds of warm processes
#              (median of per-round ratios; plain against plain is the method's noise);
#   kernels    the share taken under 30 % by kernels of 1, 10, 50 and 200 ms;
#   mps        the plugin's MPS daemon, then one started from a PID namespace of its own (hostPID off);
#   then memory, allocators, compute (cGPU policies), nvml and use, as time allows.
#
#   OUT=/some/dir tests/gpu/run_on_gpu.sh
#
# Writes $OUT/run.log (everything printed) and $OUT/figures.json (tests/gpu/probes/figures.py
# says its shape), the JSON rewritten after every figure so a run cut off returns what it had.
# Needs only python3 (with PyTorch, CuPy, JAX where the probes that use them should run; each
# probe says "skipped" with the reason where one is missing), the standard library and src/:
# gpushare's own dependencies are not installed on the GPU machine, so the few the plugin's code
# needs (msgspec, nvidia-ml-py, prometheus-client, grpcio, protobuf, PyYAML) and its generated gRPC
# stubs come from .gpu-carry/, built here by tests/gpu/make_carry.sh (name .gpu-carry/site-cp312,
# .gpu-carry/protos and .gpu-carry/lib in the call's carry list). The interposer is built with
# gcc when there is one, else taken from .gpu-carry/lib.
#
# Mode: "gpu" where nvidia-smi is on PATH, else "rehearsal" (or GPUSHARE_GPU_REHEARSAL=1): the
# same steps against the project's fake driver and NVML (harness/fakegpu/fakes), with a stand-in
# nvidia-cuda-mps-control, so the plumbing is proven without a GPU.
#
# Knobs: GPUSHARE_GPU_BUDGET_S (the steps' time, default 420, so that with the builds the call
# fits 8 minutes), GPUSHARE_GPU_STEPS (a comma list), GPUSHARE_GPU_QUICK=1 (short loads, for the
# rehearsal test), GPUSHARE_GPU_PYTHON (default python3), GPUSHARE_GPU_WORK (scratch, default
# /tmp/gpushare-gpu: the carried interposers read their limits files there).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
OUT="${OUT:-$ROOT/out/gpu-run}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1

PY="${GPUSHARE_GPU_PYTHON:-python3}"
export PYTHONUNBUFFERED=1
if [ "${GPUSHARE_GPU_REHEARSAL:-}" = 1 ] || ! command -v nvidia-smi >/dev/null; then
    MODE=rehearsal
else
    MODE=gpu
fi
WORK="${GPUSHARE_GPU_WORK:-/tmp/gpushare-gpu}"
rm -rf "$WORK" && mkdir -p "$WORK"
CARRY="$ROOT/.gpu-carry"
TAG="$("$PY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')"
PYTHONPATH="$ROOT/src:$ROOT"
[ -d "$CARRY/site-$TAG" ] && PYTHONPATH="$PYTHONPATH:$CARRY/site-$TAG"
export PYTHONPATH
# the plugin's gRPC stubs are build output, not in git: the carried ones where they are missing
if [ ! -f src/gpushare/deviceplugin/kubelet/protos/v1beta1/api_pb2.py ] && [ -d "$CARRY/protos" ]; then
    cp -r "$CARRY/protos/gpushare" src/
fi
echo "mode=$MODE python=$("$PY" --version 2>&1) tag=$TAG work=$WORK out=$OUT date=$(date -u +%FT%TZ)"

FAKE_DIR=""
if [ "$MODE" = rehearsal ]; then
    FAKE_DIR="$WORK/fake"
    mkdir -p "$FAKE_DIR/bin"
    cp harness/fakegpu/fakes/nvidia-cuda-mps-control "$FAKE_DIR/bin/"
    export PATH="$FAKE_DIR/bin:$PATH"
fi
LIB_DIR="$WORK/lib"
if command -v gcc >/dev/null && "$PY" -m tests.gpu.probes.building "$LIB_DIR" "$WORK" $FAKE_DIR; then
    FROM="built here with gcc $(gcc -dumpfullversion)"
elif [ "$WORK" = /tmp/gpushare-gpu ] && [ -f "$CARRY/lib/libgpushare-cuda.so" ]; then
    LIB_DIR="$CARRY/lib"
    FROM="carried in .gpu-carry/lib"
else
    FROM="none: no gcc and no .gpu-carry/lib for $WORK"
fi
echo "interposer: $FROM"

quit_mps() {
    for pipe in "$WORK"/state*/mps/*/pipe; do
        [ -d "$pipe" ] || continue
        echo quit | CUDA_MPS_PIPE_DIRECTORY="$pipe" timeout 10 nvidia-cuda-mps-control
        tail -n 20 "$pipe"/../log/*.log 2>/dev/null
    done
}
trap quit_mps EXIT

export GPUSHARE_GPU_MODE="$MODE" GPUSHARE_GPU_FIGURES="$OUT/figures.json" \
    GPUSHARE_GPU_WORK="$WORK" GPUSHARE_GPU_LIB_DIR="$LIB_DIR" GPUSHARE_GPU_FAKE_DIR="$FAKE_DIR" \
    GPUSHARE_GPU_PYTHON="$PY" GPUSHARE_GPU_INTERPOSER_FROM="$FROM"
"$PY" -m tests.gpu.probes.run
