"""The chart's certificate Job (``webhook.certs.mode=job``), its script run here.

The script is taken from ``helm template`` and run by ``sh`` with openssl, against a stand-in
``kubectl`` that keeps the Secret in a directory and records each patch of ``caBundle``. What it
shows: a certificate valid for more than 30 days is kept; one closer to its end is replaced by a
new CA and certificate, and then ``caBundle`` holds the new CA *and* the one in use, so
admissions pass both before and after kubelet refreshes the webhook's files (docs/webhook.md,
renewal). Before, it held the new CA alone, and every admission failed until the refresh.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.chart import HELM, find_job, render

pytestmark = pytest.mark.skipif(
    HELM is None or shutil.which("openssl") is None, reason="needs helm and openssl"
)

STUB = '''#!{python}
"""kubectl as the certificate Job uses it, with the Secret kept in $STUB_STATE."""
import base64, json, os, sys
state = os.environ["STUB_STATE"]
args = sys.argv[1:]
if "get" in args and "secret" in args:
    field = next(a for a in args if a.startswith("jsonpath="))[len("jsonpath={{.data."):-1]
    path = os.path.join(state, field.replace("\\\\", ""))
    if not os.path.exists(path):
        sys.exit("Error from server (NotFound): secrets not found")
    sys.stdout.write(base64.b64encode(open(path, "rb").read()).decode())
elif "create" in args and "secret" in args:
    for arg in args:
        if arg.startswith("--from-file="):
            name = arg.split("=", 1)[1]
            open(os.path.join(state, name), "wb").write(open(name, "rb").read())
elif args[:1] == ["apply"]:
    sys.stdin.read()
elif args[:1] == ["get"]:
    if "-o" in args:
        sys.stdout.write("x")
elif args[:1] == ["patch"]:
    with open(os.path.join(state, "patches"), "a") as log:
        log.write(json.dumps({{"kind": args[1], "patch": json.loads(args[-1])}}) + "\\n")
else:
    sys.exit("unexpected: kubectl " + " ".join(args))
'''


def job_script(work: Path) -> tuple[str, dict[str, str]]:
    """The rendered Job's script (working in ``work``, not /tmp) and its environment."""
    job = find_job(render(), "webhook-certs")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    script = container["args"][0].replace("cd /tmp\n", f"cd {work}\n")
    return script, env


def make_ca_and_certificate(work: Path, days: int) -> None:
    """A CA and a serving certificate it signs, valid ``days``, as the stored Secret."""
    work.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=work, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", str(days),
            "-subj", "/CN=in-use")  # fmt: skip
    openssl("req", *ec, "-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=webhook")
    openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", str(days), "-out", "tls.crt")  # fmt: skip


def run_job(tmp_path: Path) -> tuple[list[bytes], Path]:
    """Run the Job's script; return each caBundle it patched in (decoded) and the Secret."""
    state, work, bin_dir = tmp_path / "secret", tmp_path / "work", tmp_path / "bin"
    for folder in (state, work, bin_dir):
        folder.mkdir(exist_ok=True)
    stub = bin_dir / "kubectl"
    stub.write_text(STUB.format(python=sys.executable))
    stub.chmod(0o755)
    script, env = job_script(work)
    env.update(
        PATH=f"{bin_dir}:{os.environ['PATH']}", STUB_STATE=str(state), HOME=str(work), DAYS="30"
    )
    done = subprocess.run(
        ["/bin/sh", "-ec", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    patches = [json.loads(line) for line in (state / "patches").read_text().splitlines()]
    bundles = [base64.b64decode(op["value"]) for p in patches for op in p["patch"]]
    assert {p["kind"] for p in patches} == {
        "validatingwebhookconfiguration",
        "mutatingwebhookconfiguration",
    }
    return bundles, state


def certificates(bundle: bytes) -> list[bytes]:
    """The DER of each PEM certificate in a bundle, in order."""
    marker = "-----END CERTIFICATE-----"
    parts = [p + marker for p in bundle.decode().split(marker) if "BEGIN" in p]
    return [ssl.PEM_cert_to_DER_cert(p.strip()) for p in parts]


def test_a_certificate_near_its_end_is_renewed_with_both_cas_trusted(tmp_path: Path) -> None:
    make_ca_and_certificate(tmp_path / "secret", days=2)  # within the Job's 30 days
    in_use = (tmp_path / "secret" / "ca.crt").read_bytes()
    bundles, state = run_job(tmp_path)
    new_ca = (state / "ca.crt").read_bytes()
    assert new_ca != in_use, "a new CA"
    for bundle in bundles:
        assert certificates(bundle) == certificates(new_ca + in_use)


def test_a_certificate_with_time_left_is_kept_and_its_ca_alone_trusted(tmp_path: Path) -> None:
    make_ca_and_certificate(tmp_path / "secret", days=365)
    in_use = (tmp_path / "secret" / "ca.crt").read_bytes()
    bundles, state = run_job(tmp_path)
    assert (state / "ca.crt").read_bytes() == in_use
    assert bundles and all(certificates(b) == certificates(in_use) for b in bundles)


def test_the_first_run_makes_a_ca_and_trusts_it(tmp_path: Path) -> None:
    bundles, state = run_job(tmp_path)
    made = (state / "ca.crt").read_bytes()
    assert bundles and all(certificates(b) == certificates(made) for b in bundles)
