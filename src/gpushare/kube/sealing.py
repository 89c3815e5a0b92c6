"""Where the seal key (core.records.trust) comes from: a file, a Secret, or the in-memory cluster.

In a cluster the chart creates the Secret ``gpushare-seal`` once, with 32 random bytes, and
mounts it into the extender and every device plugin, which read it with ``--seal-key-file``.
``kubectl inspect cgpu`` reads the same Secret through the API (``--seal-secret``), as far as
the user may. The in-memory cluster (demo, tests) makes its own random key, so components on it
need no configuration; anything else without a key must be told so explicitly
(``--insecure-no-seal``), because a missing key would otherwise mean forged allocations count.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpushare.core.records.trust import SealKey, Trust, read_key
from gpushare.kube.memory import MemoryKube
from gpushare.kube.port import Conflict, KubeAPI, KubeError

DEFAULT_SECRET = "gpushare/gpushare-seal"
"""``NAMESPACE/NAME`` of the Secret the chart creates under the default release name."""
SECRET_FIELD = "key"
"""The Secret's data key holding the seal key (also the mounted file's name)."""
HOW_TO_MAKE = (
    "make a key once with `gpushare seal-key > seal.key` (or `head -c32 /dev/urandom > "
    "seal.key`) and give the same file to the extender and every device plugin with "
    "--seal-key-file (the Helm chart does this with the Secret gpushare-seal)"
)


class SealKeyError(Exception):
    """The seal key could not be read; the message says where and what to do."""


def new_key_text() -> str:
    """A fresh key as one line of text: 32 random bytes, base64url."""
    return base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")


def load_key_file(path: Path) -> SealKey:
    """The key in a file; raises SealKeyError naming the file and the fix."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise SealKeyError(f"cannot read the seal key file {path}: {err.strerror or err}") from None
    key = read_key(data, where=f"seal key file {path}")
    if isinstance(key, str):
        raise SealKeyError(key)
    return key


def key_from_secret(secret: Mapping[str, Any], *, where: str) -> SealKey | str:
    """The key in a Secret as the API returns it (``data`` base64), or why there is none."""
    data = secret.get("data") or {}
    raw = data.get(SECRET_FIELD) if isinstance(data, Mapping) else None
    if not isinstance(raw, str):
        return f"{where} has no data key {SECRET_FIELD!r}"
    try:
        decoded = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        return f"{where} data {SECRET_FIELD!r} is not base64"
    return read_key(decoded, where=where)


def parse_secret_ref(text: str) -> tuple[str, str]:
    """``NAMESPACE/NAME`` into its parts; raises ValueError saying how to write it."""
    namespace, sep, name = text.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ValueError(f"{text!r}: write NAMESPACE/NAME, such as {DEFAULT_SECRET}")
    return namespace, name


async def secret_key(api: KubeAPI, namespace: str, name: str) -> SealKey | str:
    """The key from a Secret through the API, or one line saying why it cannot be had."""
    where = f"Secret {namespace}/{name}"
    try:
        secret = await api.get_secret(namespace, name)
    except KubeError as err:
        return f"cannot read {where}: {err}"
    return key_from_secret(secret, where=where)


async def ensure_secret(
    api: KubeAPI, namespace: str, name: str, labels: Mapping[str, str]
) -> tuple[bool, str]:
    """Create the seal Secret with a fresh key unless it exists: (fine, what happened).

    Run in the cluster (the chart's seal Job), so no key is ever rendered: ``helm template``
    twice gives the same objects, and a GitOps tool applying them again changes no key. An
    existing Secret is never rewritten: one whose key does not read is reported, not replaced,
    because a new key would make every allocation sealed with the old one count nowhere.
    """
    where = f"Secret {namespace}/{name}"
    try:
        await api.create_secret(namespace, name, {SECRET_FIELD: new_key_text().encode()}, labels)
        return True, f"created {where} with a new seal key"
    except Conflict:
        pass
    found = await secret_key(api, namespace, name)
    if isinstance(found, str):
        return False, (
            f"{found}; it was left as it is: put a key in it (kubectl -n {namespace} create "
            f"secret generic {name} --from-literal={SECRET_FIELD}=$(gpushare seal-key) "
            f"--dry-run=client -o yaml | kubectl apply -f -) or delete it to have one made"
        )
    return True, f"kept {where}: it holds a seal key"


def keyless_trust(api: KubeAPI) -> Trust:
    """The in-memory cluster's own key; any other port must be given a key (SealKeyError)."""
    if isinstance(api, MemoryKube):
        # read as every other key is read, so this and the cluster's Secret are one key
        key = read_key(api.seal_key, where="the in-memory cluster's seal key")
        if isinstance(key, str):
            raise SealKeyError(key)
        return Trust.sealed(key)
    raise SealKeyError(f"no seal key is configured: {HOW_TO_MAKE}")
