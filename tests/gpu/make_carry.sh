#!/usr/bin/env bash
# Build .gpu-carry/ for tests/gpu/run_on_gpu.sh on a GPU machine with no package index:
#   site-cp312/  msgspec, nvidia-ml-py and prometheus-client at constraints.txt's versions, for its Python 3.12
#   site-cpXY/   the same for this machine's python3 (the rehearsal runs on a bare python3)
#   lib/         the interposer and one copy per container reading /tmp/gpushare-gpu/c<i>/limits,
#                for a machine without gcc (x86-64, glibc 2.34 or newer)
# Name .gpu-carry in the device call's carry list. About 3 MB.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PIP="${PIP:-.venv/bin/python -m pip}"
CARRY=.gpu-carry
rm -rf "$CARRY" && mkdir -p "$CARRY"
pins=$(grep -E '^(msgspec|nvidia-ml-py|prometheus_client)==' constraints.txt | tr '\n' ' ')
$PIP install -q --no-deps --only-binary=:all: --target "$CARRY/site-cp312" --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 $pins
tag="$(python3 -c 'import sys; print("cp%d%d" % sys.version_info[:2])')"
if [ "$tag" != cp312 ]; then
    $PIP install -q --no-deps --only-binary=:all: --target "$CARRY/site-$tag" \
        --python-version "3.${tag#cp3}" $pins
fi
PYTHONPATH="$ROOT/src:$ROOT" python3 -m tests.gpu.probes.building "$CARRY/lib" /tmp/gpushare-gpu
find "$CARRY" -name __pycache__ -prune -exec rm -rf {} +
du -sh "$CARRY"
