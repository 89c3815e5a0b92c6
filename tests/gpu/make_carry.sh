#!/usr/bin/env bash
# Build .gpu-carry/ for tests/gpu/run_on_gpu.sh on a GPU machine with no package index:
#   site-cp312/  msgspec, nvidia-ml-py, prometheus-client, and for the node step the device
#                plugin's grpcio, protobuf, PyYAML and typing_extensions, at constraints.txt's
#                versions, for its Python 3.12
#   protos/      the device plugin's generated gRPC stubs (build output, not in git), which
#                run_on_gpu.sh puts back in src/ where they are missing
#   site-cpXY/   the same for this machine's python3 (the rehearsal runs on a bare python3)
#   lib/         the interposer and one copy per container reading /tmp/gpushare-gpu/c<i>/limits,
#                for a machine without gcc (x86-64, glibc 2.34 or newer)
# About 50 MB; the GPU needs site-cp312, protos and lib (about 25 MB, grpcio 18 MB of it): name
# those three in the device call's carry list (docs/isolation.md, "On a real GPU").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PIP="${PIP:-.venv/bin/python -m pip}"
CARRY=.gpu-carry
rm -rf "$CARRY" && mkdir -p "$CARRY"
pins=$(grep -iE '^(msgspec|nvidia-ml-py|prometheus[_-]client|grpcio|protobuf|pyyaml|typing[_-]extensions)==' constraints.txt | tr '\n' ' ')
$PIP install -q --no-deps --only-binary=:all: --target "$CARRY/site-cp312" --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 $pins
tag="$(python3 -c 'import sys; print("cp%d%d" % sys.version_info[:2])')"
if [ "$tag" != cp312 ]; then
    $PIP install -q --no-deps --only-binary=:all: --target "$CARRY/site-$tag" \
        --python-version "3.${tag#cp3}" $pins
fi
mkdir -p "$CARRY/protos"
(cd src && find gpushare/deviceplugin/kubelet/protos -name 'api_pb2*' -print0 \
    | xargs -0 cp --parents -t "$ROOT/$CARRY/protos")
PYTHONPATH="$ROOT/src:$ROOT" python3 -m tests.gpu.probes.building "$CARRY/lib" /tmp/gpushare-gpu
find "$CARRY" -name __pycache__ -prune -exec rm -rf {} +
du -sh "$CARRY"
