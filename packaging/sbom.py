"""The image's SBOM: what the recipe put in it, read back from the OCI archive, as SPDX 2.3 JSON.

    python3 packaging/sbom.py --image dist/0.2.0/gpushare-image-0.2.0.oci.tar --out sbom.spdx.json

The recipe (``packaging/image.py``) installs two kinds of thing: Debian packages (mmdebstrap) and
Python wheels (pip). Both leave their own record in the root filesystem, dpkg's
``var/lib/dpkg/status`` and pip's ``*.dist-info/METADATA``; this reads those records from each
architecture's layer, so the SBOM lists what the image holds, not what a recipe meant to put
there. The release attests the image with it (``cosign attest --type spdxjson``), and publishes
it beside the image. No scanner is needed, so the dry run makes the same file as the forge does.
"""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import json
import re
import sys
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

DPKG_STATUS = "var/lib/dpkg/status"
DIST_INFO = re.compile(
    r"^usr/(?:local/)?lib/python3[^/]*/(?:dist|site)-packages/[^/]+\.dist-info/METADATA$"
)
NAMESPACE = "https://github.com/gpushare/gpushare/spdx"


class SbomError(RuntimeError):
    """The archive is not the recipe's; the message says what was expected."""


@dataclass(frozen=True, order=True)
class Package:
    """One installed package, as its installer recorded it."""

    kind: str
    """``deb`` or ``pypi`` (the purl type)."""
    name: str
    version: str
    arch: str
    """The image architecture whose layer holds it (amd64, arm64)."""
    license: str = "NOASSERTION"


def _blob(tar: tarfile.TarFile, digest: str) -> bytes:
    member = tar.extractfile("blobs/sha256/" + digest.removeprefix("sha256:"))
    if member is None:
        raise SbomError(f"blob {digest} is missing from the archive")
    return member.read()


def layers(archive: Path) -> Iterator[tuple[str, str, bytes]]:
    """(architecture, layer digest, compressed layer) for each image of the archive's index."""
    with tarfile.open(archive) as tar:
        top = json.loads(_blob_or_file(tar, "index.json"))
        for entry in top["manifests"]:
            index = json.loads(_blob(tar, entry["digest"]))
            for manifest_entry in index.get("manifests", [index] if "layers" in index else []):
                manifest = json.loads(_blob(tar, manifest_entry["digest"]))
                arch = manifest_entry.get("platform", {}).get("architecture", "unknown")
                for layer in manifest["layers"]:
                    yield arch, layer["digest"], _blob(tar, layer["digest"])


def _blob_or_file(tar: tarfile.TarFile, name: str) -> bytes:
    member = tar.extractfile(name)
    if member is None:
        raise SbomError(f"{name} is missing: not an OCI image layout archive")
    return member.read()


def dpkg_packages(status: str, arch: str) -> list[Package]:
    """Installed packages in dpkg's status file (paragraphs of ``Field: value``)."""
    found = []
    for paragraph in status.split("\n\n"):
        lines = [line for line in paragraph.splitlines() if ": " in line and line[0] != " "]
        fields = dict(line.split(": ", 1) for line in lines)
        if "Package" in fields and fields.get("Status", "").endswith(" installed"):
            found.append(Package("deb", fields["Package"], fields.get("Version", ""), arch))
    return found


def python_package(metadata: str, arch: str) -> Package:
    """A wheel's METADATA: name, version and licence (License-Expression, else License)."""
    message = email.parser.Parser().parsestr(metadata, headersonly=True)
    licence = message.get("License-Expression") or "NOASSERTION"
    return Package("pypi", message["Name"], message["Version"], arch, licence)


def packages(archive: Path) -> list[Package]:
    """Every package of every architecture's layers, sorted."""
    import gzip
    import io

    found: set[Package] = set()
    for arch, _digest, compressed in layers(archive):
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(compressed))) as layer:
            for member in layer:
                name = member.name.removeprefix("./")
                if not member.isfile() or not (name == DPKG_STATUS or DIST_INFO.match(name)):
                    continue
                handle = layer.extractfile(member)
                assert handle is not None
                text = handle.read().decode("utf-8", "replace")
                if name == DPKG_STATUS:
                    found.update(dpkg_packages(text, arch))
                else:
                    found.add(python_package(text, arch))
    if not any(p.kind == "deb" for p in found):
        raise SbomError(f"{archive}: no {DPKG_STATUS} in any layer; not the recipe's image")
    return sorted(found)


def _spdx_id(package: Package) -> str:
    name = f"{package.kind}-{package.arch}-{package.name}"
    return "SPDXRef-" + re.sub(r"[^A-Za-z0-9.-]", "-", name)


def purl(package: Package) -> str:
    """The package URL: ``pkg:deb/debian/NAME@VERSION?arch=A``, ``pkg:pypi/NAME@VERSION``."""
    if package.kind == "deb":
        return f"pkg:deb/debian/{package.name}@{package.version}?arch={package.arch}"
    return f"pkg:pypi/{package.name.lower().replace('_', '-')}@{package.version}"


def document(archive: Path, name: str, created: str) -> dict[str, object]:
    """The SPDX 2.3 document: the image (``name``, the archive's index) containing each package."""
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    found = packages(archive)
    image_id = "SPDXRef-image"
    return {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": name,
        "documentNamespace": f"{NAMESPACE}/{name.replace(':', '-')}-{digest[:16]}",
        "creationInfo": {"created": created, "creators": ["Tool: gpushare-packaging-sbom"]},
        "documentDescribes": [image_id],
        "packages": [
            {
                "SPDXID": image_id,
                "name": name,
                "downloadLocation": "NOASSERTION",
                "filesAnalyzed": False,
                "primaryPackagePurpose": "CONTAINER",
                "licenseConcluded": "NOASSERTION",
                "licenseDeclared": "Apache-2.0",
            },
            *(
                {
                    "SPDXID": _spdx_id(p),
                    "name": p.name,
                    "versionInfo": p.version,
                    "downloadLocation": "NOASSERTION",
                    "filesAnalyzed": False,
                    "licenseConcluded": "NOASSERTION",
                    "licenseDeclared": p.license if p.kind == "pypi" else "NOASSERTION",
                    "externalRefs": [
                        {
                            "referenceCategory": "PACKAGE-MANAGER",
                            "referenceType": "purl",
                            "referenceLocator": purl(p),
                        }
                    ],
                }
                for p in found
            ),
        ],
        "relationships": [
            {"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES",
             "relatedSpdxElement": image_id},
            *(
                {"spdxElementId": image_id, "relationshipType": "CONTAINS",
                 "relatedSpdxElement": _spdx_id(p)}
                for p in found
            ),
        ],
    }  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    import image

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--image", type=Path, required=True, help="the recipe's OCI archive")
    parser.add_argument("--out", type=Path, required=True, help="the SPDX JSON file to write")
    parser.add_argument("--name", default="", help="the image's name (default: REPOSITORY:VERSION)")
    args = parser.parse_args(argv)
    name = args.name or f"{image.REPOSITORY}:{image.project_version()}"
    try:
        made = document(args.image, name, image.created_time())
    except (SbomError, OSError, KeyError, ValueError) as err:
        print(f"packaging/sbom.py: --image {args.image}: {err}", file=sys.stderr)
        return 1
    args.out.write_text(json.dumps(made, indent=1, sort_keys=True) + "\n")
    count = len(made["packages"]) - 1  # type: ignore[arg-type]
    print(f"{args.out}: {count} packages")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
