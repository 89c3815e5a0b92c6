"""Build what the run preloads: ``python -m tests.gpu.probes.building LIB_DIR WORK [FAKE_DIR]``.

``LIB_DIR/libgpushare-cuda.so`` reads ``/etc/gpushare/limits`` as in a container; each
``LIB_DIR/c<i>/libgpushare-cuda.so`` reads ``WORK/c<i>/limits`` instead (the path is compiled
in, and the run cannot write /etc). With ``FAKE_DIR``, the rehearsal's fake driver, NVML and
``launches`` program too. ``tests/gpu/make_carry.sh`` builds the same for ``/tmp/gpushare-gpu``
ahead of time, for a GPU machine without gcc.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpushare.isolation import build

from .setting import CONTAINERS


def build_libs(lib_dir: Path, work: Path) -> list[Path]:
    """The plain interposer and one copy per container."""
    made = [build.build(lib_dir / build.LIB_NAME)]
    for i in range(CONTAINERS):
        limits = work / f"c{i}" / "limits"
        made.append(build.build(lib_dir / f"c{i}" / build.LIB_NAME, limits_file=str(limits)))
    return made


def main(argv: list[str]) -> int:
    lib_dir, work = Path(argv[0]), Path(argv[1])
    try:
        for path in build_libs(lib_dir, work):
            print(f"built {path}")
        if len(argv) > 2:
            from harness.fakegpu.built import build_all

            print(f"built the fakes in {build_all(Path(argv[2])).dir}")
    except build.BuildError as err:
        print(f"building: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
