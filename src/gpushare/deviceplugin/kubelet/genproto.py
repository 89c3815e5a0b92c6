"""Generate the gRPC stubs from gpushare's own copies of kubelet's .proto files (the device
plugin's in ``deviceplugin/kubelet/protos``, the DRA driver's in ``dra/protos``).

The build backend (``packaging/gpushare_build.py``) runs it for every ``pip install`` and
``pip wheel``; by hand: ``python -m gpushare.deviceplugin.kubelet.genproto``. The stubs are
build output and are not kept in git.
"""

from __future__ import annotations

import sys
from pathlib import Path

PROTOS = (
    "deviceplugin/kubelet/protos/v1beta1/api.proto",
    "deviceplugin/kubelet/protos/podresources_v1/api.proto",
    "deviceplugin/kubelet/protos/cri_v1/api.proto",
    "dra/protos/dra_v1/api.proto",
    "dra/protos/pluginregistration_v1/api.proto",
)
"""Paths under the gpushare package: the device plugin's and the DRA driver's copies."""


def generate() -> list[Path]:
    """Write ``*_pb2.py`` and ``*_pb2_grpc.py`` beside each .proto; return the paths."""
    from grpc_tools import protoc

    src = Path(__file__).resolve().parents[3]  # the directory that holds the gpushare package
    written = []
    for proto in PROTOS:
        relative = Path("gpushare") / proto
        code = protoc.main(
            [
                "protoc",
                f"-I{src}",
                f"--python_out={src}",
                f"--grpc_python_out={src}",
                f"--pyi_out={src}",
                str(relative),
            ]
        )
        if code != 0:
            raise SystemExit(f"protoc failed on {relative} (exit {code})")
        written.append(src / relative.with_name("api_pb2.py"))
    return written


if __name__ == "__main__":
    for path in generate():
        print(f"generated {path}", file=sys.stderr)
