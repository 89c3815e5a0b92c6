"""The interposer, the fake driver and NVML, and the test programs, compiled for a test.

The isolation tests, ``benchmarks/cgpu_policies.py`` and the GPU run's rehearsal
(``tests/gpu/probes``) all need the same build; it lives here, without pytest, so that a bare
Python can run it. Needs gcc.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpushare.isolation import build

HERE = Path(__file__).parent


@dataclass(frozen=True)
class Built:
    """The compiled interposer, fakes and programs."""

    dir: Path
    interposer: Path
    cuda: Path
    nvml: Path
    file_interposer: Path
    """A copy that reads its limits file at ``limits`` instead of /etc/gpushare/limits."""
    limits: Path

    def env(self, accounting: Path, **extra: str) -> dict[str, str]:
        """Environment of a container process: preload, accounting dir, fake real libraries."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")}
        env.update(
            LD_PRELOAD=str(self.interposer),
            GPUSHARE_ACCOUNTING_DIR=str(accounting),
            GPUSHARE_REAL_CUDA=str(self.cuda),
            GPUSHARE_REAL_NVML=str(self.nvml),
            MEMOPS_DRIVER=str(self.cuda),
        )
        env.update(extra)
        return env


def build_all(out: Path) -> Built:
    """Compile the interposer (plain and reading ``out/etc-gpushare/limits``), the fakes and
    the programs into ``out``."""
    interposer = build.build(out / build.LIB_NAME)
    limits = out / "etc-gpushare" / "limits"
    file_interposer = build.build(out / "file" / build.LIB_NAME, limits_file=str(limits))
    cuda = build.compile_shared(
        [HERE / "fakes" / "fake_cuda.c"],
        out / "libfakecuda.so",
        extra=("-Wl,-soname,libfakecuda.so",),
        libs=("-lpthread",),
    )
    nvml = build.compile_shared(
        [HERE / "fakes" / "fake_nvml.c"],
        out / "libfakenvml.so",
        extra=("-Wl,-soname,libfakenvml.so",),
        libs=("-ldl",),
    )
    build.compile_shared([HERE / "fakes" / "next_hook.c"], out / "libnexthook.so", libs=("-ldl",))
    for program in ("memops", "launches"):
        cmd = [
            "gcc",
            *build.CFLAGS,
            f"-I{build.NATIVE}",
            "-o",
            str(out / program),
            str(HERE / "programs" / f"{program}.c"),
            f"-L{out}",
            "-lfakecuda",
            "-lfakenvml",
            "-ldl",
            f"-Wl,-rpath,{out}",
        ]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    return Built(out, interposer, cuda, nvml, file_interposer, limits)
