"""The Dockerfile and the archive builder (tests/e2e/image_archive.py) describe one image.

``make image`` builds from the Dockerfile where a Docker engine exists; ``make image-archive``
builds the same image from Debian packages where none does (the real-node Helm test runs it).
This test reads the Dockerfile's runtime and builder stages into the builder's
:class:`ImageDescription` and compares field by field, so a change to either (an ENV, the user,
the entrypoint, the wheel set, the install, the interposer) fails here until the other follows.
"""

from __future__ import annotations

import json
import re
import shlex
import tarfile
from pathlib import Path

import pytest

from tests.e2e.image_archive import (
    PATH_ENV,
    Account,
    ImageDescription,
    gpushare_image,
    oci_config,
    project_version,
    write_archive,
)
from tests.unit.test_dockerfile import DOCKERFILE, REPO, Stage, parse, resolve


def _env(stage: Stage) -> tuple[tuple[str, str], ...]:
    pairs: list[tuple[str, str]] = []
    for args in stage.all("ENV"):
        for word in shlex.split(args):
            key, _, value = word.partition("=")
            pairs.append((key, value))
    return tuple(pairs)


def _labels(stage: Stage, args: dict[str, str]) -> tuple[tuple[str, str], ...]:
    pairs: list[tuple[str, str]] = []
    for text in stage.all("LABEL"):
        for word in shlex.split(text):
            key, _, value = word.partition("=")
            pairs.append((key, resolve(value, args)))
    return tuple(pairs)


def _options(command: str) -> tuple[dict[str, str], str]:
    """A groupadd/useradd command's --option values and its last word (the name)."""
    words = shlex.split(command)
    options = {w: words[i + 1] for i, w in enumerate(words[:-1]) if w in OPTIONS_WITH_VALUES}
    return options, words[-1]


OPTIONS_WITH_VALUES = ("--uid", "--gid", "--shell")


def _account(stage: Stage) -> Account | None:
    commands = [c.strip() for r in stage.all("RUN") for c in r.split("&&")]
    groups = [_options(c) for c in commands if c.startswith("groupadd")]
    users = [_options(c) for c in commands if c.startswith("useradd")]
    if not groups or not users:
        return None
    (group, group_name), (user, name) = groups[-1], users[-1]
    assert group_name == name, "the group is named after the user"
    assert group["--gid"] == user["--gid"], "the user's group is the one created"
    return Account(name=name, uid=int(user["--uid"]), gid=int(user["--gid"]), shell=user["--shell"])


def _wheel_args(builder: Stage) -> tuple[str, ...]:
    """The `pip wheel` options, without --wheel-dir and its value and the source '.'."""
    run = " ".join(builder.all("RUN"))
    command = next(c for c in run.split("&&") if "pip wheel" in c)
    words = shlex.split(command)
    words = words[words.index("wheel") + 1 :]
    out: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word == "--wheel-dir":
            skip = True
        elif word != ".":
            out.append(word)
    return tuple(out)


def _requirement(runtime: Stage, args: dict[str, str]) -> str:
    run = next(r for r in runtime.all("RUN") if "pip install" in r)
    words = shlex.split(run)
    return resolve(words[-1], args)


def describe_dockerfile(text: str) -> ImageDescription:
    """The Dockerfile's image in the builder's terms."""
    args, stages = parse(text)
    builder, runtime = stages
    # stage-level ARGs with defaults (VERSION) resolve the runtime's references
    for arg in runtime.all("ARG"):
        key, _, default = arg.partition("=")
        args[key] = default
    copied = tuple(source for copy in builder.all("COPY") for source in shlex.split(copy)[:-1])
    workdirs = runtime.all("WORKDIR")
    return ImageDescription(
        entrypoint=tuple(json.loads(runtime.all("ENTRYPOINT")[-1])),
        cmd=tuple(json.loads(runtime.all("CMD")[-1])) if runtime.all("CMD") else (),
        user=runtime.all("USER")[-1],
        workdir=workdirs[-1] if workdirs else "",
        env=_env(runtime),
        exposed_ports=tuple(
            p if "/" in p else f"{p}/tcp" for e in runtime.all("EXPOSE") for p in e.split()
        ),
        labels=_labels(runtime, args),
        account=_account(runtime),
        sources=copied,
        wheel_args=_wheel_args(builder),
        requirement=_requirement(runtime, args),
        # the wheel carries what the interposer build writes under the package
        interposer=_interposer_in_package(),
    )


def _interposer_in_package() -> str:
    """Where the interposer sits in the installed package: pyproject's package data."""
    text = (REPO / "pyproject.toml").read_text()
    data = re.search(r"\[tool\.setuptools\.package-data\]\ngpushare = \[(.*?)\]", text, re.S)
    assert data, "pyproject.toml has gpushare package data"
    libs = [
        item.strip().strip('"')
        for item in data.group(1).split(",")
        if item.strip().endswith('.so"')
    ]
    assert len(libs) == 1, libs
    return f"gpushare/{libs[0]}"


@pytest.fixture(scope="module")
def dockerfile_image() -> ImageDescription:
    return describe_dockerfile(DOCKERFILE.read_text())


def test_the_dockerfile_and_the_builder_describe_the_same_image(
    dockerfile_image: ImageDescription,
) -> None:
    built = gpushare_image(project_version())
    for name in ImageDescription.__dataclass_fields__:
        assert getattr(dockerfile_image, name) == getattr(built, name), (
            f"{name}: Dockerfile says {getattr(dockerfile_image, name)!r}, "
            f"tests/e2e/image_archive.py says {getattr(built, name)!r}; change both"
        )


def test_the_dockerfiles_version_default_is_the_projects(
    dockerfile_image: ImageDescription,
) -> None:
    assert dockerfile_image.requirement == f"gpushare=={project_version()}"


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("USER 65532:65532", "USER 65533:65533", "user"),
        ('ENTRYPOINT ["gpushare"]', 'ENTRYPOINT ["python", "-m", "gpushare"]', "entrypoint"),
        ("PYTHONUNBUFFERED=1", "PYTHONUNBUFFERED=0", "env"),
        ('CMD ["--help"]', 'CMD ["--help"]\nEXPOSE 9400', "exposed_ports"),
        ('CMD ["--help"]', 'CMD ["--help"]\nWORKDIR /app', "workdir"),
        ("-c constraints.txt --wheel-dir", "--wheel-dir", "wheel_args"),
        ('"gpushare==${VERSION}"', '"gpushare[bench]==${VERSION}"', "requirement"),
        ("COPY packaging ./packaging\n", "", "sources"),
        ("--uid 65532", "--uid 1000", "account"),
    ],
)
def test_a_dockerfile_change_is_seen(old: str, new: str, field: str) -> None:
    text = DOCKERFILE.read_text()
    assert old in text, f"the Dockerfile no longer contains {old!r}: update this test"
    changed = describe_dockerfile(text.replace(old, new, 1))
    built = gpushare_image(project_version())
    assert getattr(changed, field) != getattr(built, field)


def test_the_archive_carries_the_description(tmp_path: Path) -> None:
    layer = tmp_path / "layer.tar"
    with tarfile.open(layer, "w") as tar:
        tar.add(str(DOCKERFILE), arcname="Dockerfile")
    image = gpushare_image("9.9.9")
    archive = tmp_path / "image.tar"
    write_archive(archive, "gpushare.local/gpushare:9.9.9", layer, image, "test")
    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        assert manifest[0]["RepoTags"] == ["gpushare.local/gpushare:9.9.9"]
        config = json.load(tar.extractfile(manifest[0]["Config"]))  # type: ignore[arg-type]
    assert config == oci_config(image, config["rootfs"]["diff_ids"][0], "test")
    assert config["config"]["Entrypoint"] == ["gpushare"]
    assert config["config"]["User"] == "65532:65532"
    assert config["config"]["Env"][0] == PATH_ENV
    assert "PYTHONUNBUFFERED=1" in config["config"]["Env"]
    assert config["config"]["Labels"]["org.opencontainers.image.version"] == "9.9.9"
