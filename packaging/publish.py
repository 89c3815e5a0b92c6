"""Publishing a release: the one list of steps the forge's workflow runs and the dry run rehearses.

    python3 packaging/publish.py STEP        # one step, as .github/workflows/release.yml runs it
    python3 packaging/publish.py --dry-run   # every step here, pushing to a local registry

``.github/workflows/release.yml`` runs, on a tag ``v<version>``, one workflow step per entry of
``STEPS``, each as ``python3 packaging/publish.py <step>``, and nothing else that publishes;
tests/integration/packaging/test_publish.py holds the workflow to that list, so the workflow
and the dry run cannot drift apart. The dry run (``make release-dryrun``) runs the very same
commands with the registry swapped for ``crane registry serve`` on 127.0.0.1 (plain HTTP), and
prints, without running them, the commands that need the forge: keyless signing (the workflow's
OIDC token, Fulcio and Rekor) and the GitHub release (its API). The tools come from
``packaging/tools.sh``, the same pinned versions in both.

What a release publishes (docs/releasing.md says how a user installs and verifies each):

- the image ``ghcr.io/<owner>/gpushare:<version>`` (amd64 and arm64) from ``packaging/image.py``
  with Debian pinned to ``DEBIAN_SNAPSHOT``, its SPDX SBOM (``packaging/sbom.py``) as a cosign
  attestation, and a keyless cosign signature;
- the chart at ``oci://ghcr.io/<owner>/charts/gpushare``, signed the same way;
- on the GitHub release: the wheel and sdist, the kubectl plugin per OS and architecture, its
  krew manifest, the SBOM, the image's OCI archive, LICENSE, CHANGELOG.md and SHA256SUMS.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import image
import release

REPO = image.REPO
DEBIAN_SNAPSHOT = "20261201T000000Z"
"""The moment of Debian's archive (snapshot.debian.org) a release's image is built from. Moving
it is a reviewed change: the next release then takes Debian's fixes since."""
RELEASE_ARCHES = "amd64,arm64"


class PublishError(RuntimeError):
    """A step cannot run or failed; the message says which and what to do."""


@dataclass
class Context:
    """What every step reads: the version, where the artifacts are, where they go."""

    version: str
    dist: Path
    registry: str
    """``ghcr.io/<owner>`` on the forge; ``127.0.0.1:<port>/<owner>`` in the dry run."""
    dry_run: bool = False
    arches: str = RELEASE_ARCHES
    snapshot: str = DEBIAN_SNAPSHOT
    prebuilt_image: Path | None = None
    """The dry run may reuse an archive the same recipe built (harness/image_archive.py's)."""
    tools: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    @property
    def chart_version(self) -> str:
        return release.semver(self.version)

    @property
    def image_ref(self) -> str:
        return f"{self.registry}/gpushare:{self.version}"

    @property
    def image_archive(self) -> Path:
        return self.dist / f"gpushare-image-{self.version}.oci.tar"

    @property
    def sbom(self) -> Path:
        return self.dist / f"gpushare-image-{self.version}.spdx.json"

    @property
    def chart(self) -> Path:
        return self.dist / f"gpushare-{self.chart_version}.tgz"

    def plain_http(self, flag: str) -> list[str]:
        """The flag that lets a tool talk to the dry run's local registry (no TLS)."""
        return [flag] if self.dry_run else []

    def tool(self, name: str) -> str:
        if name not in self.tools:
            found = subprocess.run(
                ["bash", str(REPO / "packaging" / "tools.sh"), name],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if found.returncode != 0:
                raise PublishError(f"packaging/tools.sh {name} failed:\n{found.stderr[-2000:]}")
            self.tools[name] = found.stdout.strip().splitlines()[-1]
        return self.tools[name]


def run(
    ctx: Context,
    argv: Sequence[str],
    *,
    forge_only: str = "",
    env: dict[str, str] | None = None,
    stdin: str | None = None,
) -> str:
    """Run one command (printed first, as the workflow's log shows it); ``forge_only`` names why
    the dry run cannot run it, and the dry run prints it as skipped instead."""
    shown = " ".join(argv)
    if ctx.dry_run and forge_only:
        print(f"[skip] {shown}\n       ({forge_only})", flush=True)
        ctx.skipped.append(f"{shown}: {forge_only}")
        return ""
    print(f"[run] {shown}", flush=True)
    done = subprocess.run(
        list(argv), cwd=REPO, env={**os.environ, **(env or {})}, capture_output=True, text=True,
        input=stdin, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
        raise PublishError(f"{argv[0]} failed (exit {done.returncode}):\n{tail}")
    if done.stdout.strip():
        print(done.stdout.rstrip(), flush=True)
    return done.stdout


# -- the steps ------------------------------------------------------------------------------------


def check_tag(ctx: Context) -> None:
    """The tag must be ``v`` + pyproject.toml's version, and the chart must carry it."""
    tag = os.environ.get("GITHUB_REF_NAME", "") if not ctx.dry_run else f"v{ctx.version}"
    if tag != f"v{ctx.version}":
        raise PublishError(
            f"tag {tag!r} does not name pyproject.toml's version {ctx.version}: tag the commit "
            f"v{ctx.version}, or set version in pyproject.toml and Chart.yaml first"
        )
    release.check_versions(ctx.version)
    print(f"[ok] tag v{ctx.version}, chart {ctx.chart_version}", flush=True)


def build(ctx: Context) -> None:
    """Every artifact into dist/<version>: the image (both architectures, Debian pinned), then
    packaging/release.py's wheel, sdist, chart, plugin archives and krew manifest."""
    ctx.dist.mkdir(parents=True, exist_ok=True)
    if ctx.prebuilt_image is not None:
        print(f"[reuse] {ctx.prebuilt_image}: built by the same recipe (packaging/image.py)")
        shutil.copyfile(ctx.prebuilt_image, ctx.image_archive)
    else:
        run(ctx, [
            sys.executable, "packaging/image.py", "--out", str(ctx.image_archive),
            "--arch", ctx.arches, *(["--snapshot", ctx.snapshot] if ctx.snapshot else []),
        ])  # fmt: skip
    run(
        ctx,
        [sys.executable, "packaging/release.py", "--out", str(ctx.dist),
         "--image", str(ctx.image_archive)],
        env={"HELM": ctx.tool("helm")},
    )  # fmt: skip


def login(ctx: Context) -> None:
    """oras, crane (and so cosign, which reads the same Docker config) and helm log in to the
    registry with the workflow's token, given on standard input."""
    host = ctx.registry.split("/", 1)[0]
    user = os.environ.get("GITHUB_ACTOR", "")
    token = os.environ.get("GITHUB_TOKEN", "")
    if not ctx.dry_run and not (user and token):
        raise PublishError("GITHUB_ACTOR and GITHUB_TOKEN must be set (the workflow sets both)")
    why = "logging in to the forge's registry needs its token"
    for argv in (
        [ctx.tool("oras"), "login", host, "-u", user, "--password-stdin"],
        [ctx.tool("crane"), "auth", "login", host, "-u", user, "--password-stdin"],
        [ctx.tool("helm"), "registry", "login", host, "-u", user, "--password-stdin"],
    ):
        run(ctx, argv, forge_only=why, stdin=token)


def sbom(ctx: Context) -> None:
    """The image's SPDX SBOM, read back from its layers (packaging/sbom.py), and its sum added
    to SHA256SUMS."""
    run(ctx, [
        sys.executable, "packaging/sbom.py", "--image", str(ctx.image_archive),
        "--out", str(ctx.sbom), "--name", ctx.image_ref,
    ])  # fmt: skip
    import hashlib

    sums = ctx.dist / "SHA256SUMS"
    kept = [line for line in sums.read_text().splitlines() if not line.endswith(ctx.sbom.name)]
    digest = hashlib.sha256(ctx.sbom.read_bytes()).hexdigest()
    sums.write_text("".join(f"{line}\n" for line in [*kept, f"{digest}  {ctx.sbom.name}"]))


def push_image(ctx: Context) -> None:
    """The OCI archive to the registry as one index (oras keeps every manifest and digest), then
    its digest, which the signature names and docs/releasing.md tells users to pin."""
    run(ctx, [
        ctx.tool("oras"), "cp", "--from-oci-layout", f"{ctx.image_archive}:{ctx.version}",
        *ctx.plain_http("--to-plain-http"), ctx.image_ref,
    ])  # fmt: skip
    digest = run(ctx, [ctx.tool("crane"), "digest", *ctx.plain_http("--insecure"), ctx.image_ref])
    want = _archive_digest(ctx.image_archive)
    if digest.strip() != want:
        raise PublishError(f"{ctx.image_ref} is {digest.strip()} after the push, not {want}")
    (ctx.dist / "image-digest").write_text(want + "\n")


def sign_image(ctx: Context) -> None:
    """Keyless cosign: a signature on the image's digest and the SBOM as an SPDX attestation."""
    ref = f"{ctx.registry}/gpushare@{(ctx.dist / 'image-digest').read_text().strip()}"
    why = "keyless signing needs the forge's OIDC token, Fulcio and Rekor"
    run(ctx, ["cosign", "sign", "--yes", ref], forge_only=why)
    run(ctx, ["cosign", "attest", "--yes", "--type", "spdxjson", "--predicate", str(ctx.sbom),
              ref], forge_only=why)  # fmt: skip


def push_chart(ctx: Context) -> None:
    """The chart to ``oci://<registry>/charts``, then signed (keyless) by its digest."""
    run(ctx, [
        ctx.tool("helm"), "push", str(ctx.chart), f"oci://{ctx.registry}/charts",
        *ctx.plain_http("--plain-http"),
    ])  # fmt: skip
    digest = run(ctx, [
        ctx.tool("crane"), "digest", *ctx.plain_http("--insecure"),
        f"{ctx.registry}/charts/gpushare:{ctx.chart_version}",
    ]).strip()  # fmt: skip
    run(
        ctx,
        ["cosign", "sign", "--yes", f"{ctx.registry}/charts/gpushare@{digest}"],
        forge_only="keyless signing needs the forge's OIDC token, Fulcio and Rekor",
    )


def verify(ctx: Context) -> None:
    """What a user pulls, pulled back: the image index (both architectures) and the chart."""
    manifest = json.loads(
        run(ctx, [ctx.tool("crane"), "manifest", *ctx.plain_http("--insecure"), ctx.image_ref])
    )
    arches = sorted(m["platform"]["architecture"] for m in manifest["manifests"])
    if arches != sorted(ctx.arches.split(",")):
        raise PublishError(f"{ctx.image_ref} holds {arches}, not {ctx.arches}")
    shown = run(ctx, [
        ctx.tool("helm"), "show", "chart", f"oci://{ctx.registry}/charts/gpushare",
        "--version", ctx.chart_version, *ctx.plain_http("--plain-http"),
    ])  # fmt: skip
    if f"version: {ctx.chart_version}" not in shown:
        raise PublishError(f"the chart pulled back does not say version {ctx.chart_version}")


def release_files(ctx: Context) -> list[Path]:
    """What the GitHub release carries: the dist folder, all but the digest note."""
    return sorted(p for p in ctx.dist.iterdir() if p.name != "image-digest")


def github_release(ctx: Context) -> None:
    """The GitHub release for the tag, with every file and the image digest in its notes."""
    notes = ctx.dist.parent / f"release-notes-{ctx.version}.md"
    digest = (ctx.dist / "image-digest").read_text().strip()
    notes.write_text(
        f"Image: `{ctx.image_ref}` (`{digest}`)\n"
        f"Chart: `helm install gpushare oci://{ctx.registry}/charts/gpushare --version "
        f"{ctx.chart_version}`\n\nInstall and verify: docs/releasing.md. Changes: CHANGELOG.md.\n"
    )
    prerelease = ["--prerelease"] if "-" in ctx.chart_version else []
    run(
        ctx,
        ["gh", "release", "create", f"v{ctx.version}", "--verify-tag", "--title",
         f"gpushare {ctx.version}", "--notes-file", str(notes), *prerelease,
         *(str(p) for p in release_files(ctx))],
        forge_only="creating a GitHub release needs the forge's API and token",
    )  # fmt: skip


@dataclass(frozen=True)
class Step:
    name: str
    run: Callable[[Context], None]


STEPS = (
    Step("check-tag", check_tag),
    Step("build", build),
    Step("sbom", sbom),
    Step("login", login),
    Step("push-image", push_image),
    Step("sign-image", sign_image),
    Step("push-chart", push_chart),
    Step("verify", verify),
    Step("github-release", github_release),
)
"""In order; the workflow runs each as ``python3 packaging/publish.py <name>``."""


def _archive_digest(archive: Path) -> str:
    """The digest of the image index the archive's index.json names (what the registry keeps)."""
    import tarfile

    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise PublishError(f"{archive}: no index.json; not the recipe's OCI archive")
        (entry,) = json.load(member)["manifests"]
    return str(entry["digest"])


# -- the dry run's registry -----------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def dry_run(ctx: Context, steps: Sequence[Step] = STEPS) -> int:
    """Every step against ``crane registry serve`` on 127.0.0.1 (in memory, gone at the end)."""
    port = _free_port()
    server = subprocess.Popen(
        [ctx.tool("crane"), "registry", "serve", "--address", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise PublishError("crane registry serve did not listen within 10 s") from None
                time.sleep(0.1)
        ctx.registry = f"127.0.0.1:{port}/gpushare"
        for step in steps:
            print(f"== {step.name}", flush=True)
            step.run(ctx)
    finally:
        server.terminate()
        server.wait(timeout=10)
    print("\ndry run: every step ran against a local registry, except:")
    for skipped in ctx.skipped:
        print(f"  - {skipped}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("step", nargs="?", choices=[s.name for s in STEPS], help="one step")
    parser.add_argument("--dry-run", action="store_true", help="every step, pushing locally")
    parser.add_argument("--dist", type=Path, default=None, help="default dist/<version>")
    parser.add_argument(
        "--image", type=Path, default=None, help="dry run: reuse this archive of the recipe"
    )
    parser.add_argument("--arch", default="", help=f"image arches (default {RELEASE_ARCHES})")
    args = parser.parse_args(argv)
    if args.dry_run == bool(args.step):
        parser.error("name one STEP, or --dry-run for all of them")
    version = image.project_version()
    owner = os.environ.get("GITHUB_REPOSITORY_OWNER", "gpushare").lower()
    ctx = Context(
        version=version,
        dist=args.dist or REPO / "dist" / version,
        registry=f"ghcr.io/{owner}",
        dry_run=args.dry_run,
        arches=args.arch or (image.host_arch().debian if args.dry_run else RELEASE_ARCHES),
        # snapshot.debian.org is not among what the test machines reach: the dry run builds from
        # deb.debian.org unless DEBIAN_SNAPSHOT says otherwise
        snapshot=os.environ.get("DEBIAN_SNAPSHOT", "") if args.dry_run else DEBIAN_SNAPSHOT,
        prebuilt_image=args.image,
    )
    try:
        if args.dry_run:
            with tempfile.TemporaryDirectory(prefix="gpushare-dryrun-") as tmp:
                ctx.dist = args.dist or Path(tmp) / version
                return dry_run(ctx)
        (step,) = (s for s in STEPS if s.name == args.step)
        step.run(ctx)
    except (PublishError, release.ReleaseError, image.RecipeError) as err:
        print(f"packaging/publish.py: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
