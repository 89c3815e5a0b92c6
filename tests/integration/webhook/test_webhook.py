"""The webhook app in-process over ASGI, its commands, and its configuration renderer."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from click.testing import CliRunner

from gpushare.cli import main as gpushare
from gpushare.core.admitting.admission import AdmissionSettings
from gpushare.core.model.units import MemoryUnit
from gpushare.webhook.app import create_app
from gpushare.webhook.configuration import webhook_configuration

GOLDEN = Path(__file__).resolve().parents[2] / "golden"


def golden_request(case: str) -> Any:
    return json.loads((GOLDEN / f"admission_{case}.json").read_text())["in"]


async def exchange(
    calls: list[tuple[str, bytes]], settings: AdmissionSettings | None = None
) -> list[httpx.Response]:
    app = create_app(settings or AdmissionSettings())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="https://webhook") as client:
        answers = []
        for path, body in calls:
            if body:
                answers.append(
                    await client.post(
                        path, content=body, headers={"content-type": "application/json"}
                    )
                )
            else:
                answers.append(await client.get(path))
        return answers


def test_validate_answers_the_golden_reviews_and_counts_them() -> None:
    cases = ["valid_pod", "job_bad_core", "missing_scheduler_steered", "malformed_request"]
    calls = [("/validate", json.dumps(golden_request(c)).encode()) for c in cases]
    calls += [("/validate", b"{not json"), ("/metrics", b""), ("/healthz", b""), ("/readyz", b"")]
    steered = ("/mutate", json.dumps(golden_request("steered_pod")).encode())
    mutated, *reviews, metrics, healthz, readyz = asyncio.run(exchange([steered, *calls]))
    golden_steered = json.loads((GOLDEN / "admission_steered_pod.json").read_text())["out"]
    assert mutated.status_code == 200 and mutated.json() == golden_steered
    for case, answer in zip(cases, reviews, strict=False):
        assert answer.status_code == 200
        expected = json.loads((GOLDEN / f"admission_{case}.json").read_text())["out"]
        assert answer.json() == expected
    unreadable = reviews[-1].json()["response"]
    assert (
        unreadable["allowed"] is False and "the body is not JSON" in unreadable["status"]["message"]
    )
    text = metrics.text
    assert 'gpushare_webhook_reviews_total{decision="allowed",kind="Pod"} 1.0' in text
    assert 'gpushare_webhook_reviews_total{decision="denied",kind="Job"} 1.0' in text
    assert 'gpushare_webhook_reviews_total{decision="warned",kind="Job"} 1.0' in text
    assert 'gpushare_webhook_reviews_total{decision="mutated",kind="Pod"} 1.0' in text
    assert 'gpushare_webhook_reviews_total{decision="malformed",kind="unknown"} 2.0' in text
    assert "gpushare_webhook_review_duration_seconds_count 6.0" in text
    assert healthz.status_code == 200 and readyz.status_code == 200


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "the body is JSON nested too deeply"),
        (b'{"a": ' * 100_000 + b"{}" + b"}" * 100_000, "the body is JSON nested too deeply"),
        (b'{"apiVersion": "admission.k8s.io/v1\xff"}', "the body is not UTF-8"),
    ],
)
def test_unreadable_bodies_are_denied_with_a_reason_not_a_500(body: bytes, needle: str) -> None:
    (answer,) = asyncio.run(exchange([("/validate", body)]))
    assert answer.status_code == 200  # a denial the API server shows; a 5xx is its failurePolicy
    response = answer.json()["response"]
    assert response["allowed"] is False and response["status"]["code"] == 400
    assert needle in response["status"]["message"]


def test_a_quantity_kubernetes_counts_as_three_is_admitted() -> None:
    request = golden_request("valid_pod")
    limits = request["request"]["object"]["spec"]["containers"][0]["resources"]["limits"]
    limits["aliyun.com/gpu-mem"] = "+3"
    (answer,) = asyncio.run(exchange([("/validate", json.dumps(request).encode())]))
    assert answer.json()["response"]["allowed"] is True


def test_the_app_uses_its_configured_unit() -> None:
    request = golden_request("gpu_count_not_dividing")
    (answer,) = asyncio.run(
        exchange(
            [("/validate", json.dumps(request).encode())],
            AdmissionSettings(unit=MemoryUnit.MiB128),
        )
    )
    assert "3x128MiB" in answer.json()["response"]["status"]["message"]


def test_webhook_command_refuses_bad_flags_before_serving(tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(
        gpushare,
        ["webhook", "--tls-cert-file", str(tmp_path / "no.crt"), "--tls-private-key-file", "x"],
    )
    assert missing.exit_code == 2 and "--tls-cert-file" in missing.output
    cert = tmp_path / "tls.crt"
    cert.write_text("x")
    unit = runner.invoke(
        gpushare,
        [
            "webhook",
            "--tls-cert-file",
            str(cert),
            "--tls-private-key-file",
            str(cert),
            "--gpu-memory-unit",
            "1MiB",
        ],
    )
    assert unit.exit_code == 2 and "gpuMemoryUnit='1MiB' is not supported" in unit.output


def test_webhook_config_with_dra_puts_the_dra_webhooks_before_steering(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    args = ["webhook-config", "--url", "https://h:9443/validate", "--ca-bundle-file", str(ca)]
    result = CliRunner().invoke(gpushare, [*args, "--dra"])
    assert result.exit_code == 0, result.output
    _, mutating = yaml.safe_load_all(result.output)
    urls = {w["name"]: w["clientConfig"]["url"] for w in mutating["webhooks"]}
    assert list(urls) == ["dra-namespace.gpushare.io", "dra.gpushare.io", "steer.gpushare.io"]
    assert urls["dra.gpushare.io"] == "https://h:9443/mutate-dra"
    assert urls["dra-namespace.gpushare.io"] == "https://h:9443/mutate-dra-namespace"
    conditions = [c["name"] for c in mutating["webhooks"][1]["matchConditions"]]
    assert conditions == ["asks-gpushare", "names-no-claims", "demands-dra-nodes"]
    # everywhere DRA: the second webhook no longer asks the pod to demand DRA nodes
    every = CliRunner().invoke(
        gpushare, [*args, "--dra", "--dra-default-mode", "dra", "--no-steer"]
    )
    assert every.exit_code == 0, every.output
    _, mutating = yaml.safe_load_all(every.output)
    assert [w["name"] for w in mutating["webhooks"]] == [
        "dra-namespace.gpushare.io",
        "dra.gpushare.io",
    ]
    assert "demands-dra-nodes" not in str(mutating["webhooks"][1]["matchConditions"])
    wrong = CliRunner().invoke(gpushare, [*args[:2], "https://h:9443/x", *args[3:], "--dra"])
    assert wrong.exit_code != 0 and "/mutate-dra" in wrong.output


def test_webhook_config_renders_url_or_service_with_the_chosen_failure_policy(
    tmp_path: Path,
) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    result = CliRunner().invoke(
        gpushare,
        [
            "webhook-config",
            "--service",
            "gpushare/gpushare-webhook:9443",
            "--ca-bundle-file",
            str(ca),
            "--namespace-label",
            "gpushare.io/validate=on",
        ],
    )
    assert result.exit_code == 0, result.output
    document, steering = yaml.safe_load_all(result.output)
    (hook,) = document["webhooks"]
    assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["clientConfig"]["service"] == {
        "path": "/validate",
        "namespace": "gpushare",
        "name": "gpushare-webhook",
        "port": 9443,
    }
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == ca.read_bytes()
    assert hook["namespaceSelector"]["matchLabels"] == {"gpushare.io/validate": "on"}
    pods = [r for r in hook["rules"] if r["resources"] == ["pods"]]
    assert pods[0]["operations"] == ["CREATE", "UPDATE"]  # annotation patches are UPDATEs
    debug = [r for r in hook["rules"] if r["resources"] == ["pods/ephemeralcontainers"]]
    assert debug[0]["operations"] == ["UPDATE"]
    # nobody trusted, nobody left out: only the narrowing to what gpushare must see
    assert [c["name"] for c in hook["matchConditions"]] == ["gpushare-must-see"]
    assert steering["kind"] == "MutatingWebhookConfiguration"
    (steer,) = steering["webhooks"]
    assert steer["clientConfig"]["service"]["path"] == "/mutate"
    assert steer["failurePolicy"] == "Fail" and steer["reinvocationPolicy"] == "Never"
    assert steer["rules"][0]["resources"] == ["pods"]
    assert steer["rules"][0]["operations"] == ["CREATE"]
    assert steer["namespaceSelector"] == hook["namespaceSelector"]
    conditions = {c["name"]: c["expression"] for c in steer["matchConditions"]}
    assert conditions["names-no-scheduler"].endswith('in ["default-scheduler"]')
    assert "'aliyun.com/gpu-mem'" in conditions["asks-gpushare"]
    ignoring = webhook_configuration(
        ca_bundle="", url="https://127.0.0.1:9443/validate", failure_policy="Ignore"
    )
    assert ignoring["webhooks"][0]["failurePolicy"] == "Ignore"
    with pytest.raises(ValueError, match="exactly one"):
        webhook_configuration(ca_bundle="")


def test_webhook_config_leaves_trusted_identities_out_and_prints_the_policy(
    tmp_path: Path,
) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    extender = "system:serviceaccount:gpushare:gpushare-scheduler"
    plugin = "system:serviceaccount:gpushare:gpushare-device-plugin"
    result = CliRunner().invoke(
        gpushare,
        [
            "webhook-config",
            "--url",
            "https://127.0.0.1:9443/validate",
            "--ca-bundle-file",
            str(ca),
            "--trusted-user",
            extender,
            "--trusted-user",
            plugin,
            "--trusted-group",
            "gpushare:writers",
            "--with-policy",
        ],
    )
    assert result.exit_code == 0, result.output
    configuration, steering, policy, binding = yaml.safe_load_all(result.output)
    assert steering["webhooks"][0]["clientConfig"]["url"] == "https://127.0.0.1:9443/mutate"
    _, condition = configuration["webhooks"][0]["matchConditions"]
    assert condition == {
        "name": "not-trusted",
        "expression": f'!(request.userInfo.username in ["{extender}","{plugin}"]) && '
        '!request.userInfo.groups.exists(g, g in ["gpushare:writers"])',
    }
    assert policy["kind"] == "ValidatingAdmissionPolicy"
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["matchConditions"] == [condition]
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["pods", "pods/status"]
    assert binding["kind"] == "ValidatingAdmissionPolicyBinding"
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert (
        binding["spec"]["matchResources"]["namespaceSelector"]
        == (configuration["webhooks"][0]["namespaceSelector"])
    )


def test_the_app_refuses_tampering_and_passes_the_trusted_identities() -> None:
    from gpushare.core.admitting.tampering import TrustedWriters

    request = golden_request("tampered_pod")
    plugin = "system:serviceaccount:gpushare:gpushare-device-plugin"
    settings = AdmissionSettings(trust=TrustedWriters(users=frozenset({plugin})))
    before = request["request"]["object"]
    before["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_ASSIGNED"] = "false"
    before["spec"]["containers"][0].pop("env")
    after = json.loads(json.dumps(before))
    after["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_ASSIGNED"] = "true"
    request["request"].update(operation="UPDATE", object=after, oldObject=before)
    tenant = json.loads(json.dumps(request))
    tenant["request"]["userInfo"] = {"username": "alice", "groups": ["system:authenticated"]}
    request["request"]["userInfo"] = {"username": plugin}
    served, forged, metrics = asyncio.run(
        exchange(
            [
                ("/validate", json.dumps(request).encode()),
                ("/validate", json.dumps(tenant).encode()),
                ("/metrics", b""),
            ],
            settings,
        )
    )
    assert served.json()["response"]["allowed"] is True
    refusal = forged.json()["response"]
    assert refusal["allowed"] is False and refusal["status"]["code"] == 403
    assert 'by "alice"' in refusal["status"]["message"]
    assert 'gpushare_webhook_reviews_total{decision="denied",kind="Pod"} 1.0' in metrics.text


def test_webhook_config_steering_can_be_left_out_or_pointed_elsewhere(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    base = ["webhook-config", "--ca-bundle-file", str(ca)]
    alone = CliRunner().invoke(gpushare, [*base, "--url", "https://h:1/validate", "--no-steer"])
    assert alone.exit_code == 0, alone.output
    assert [d["kind"] for d in yaml.safe_load_all(alone.output)] == [
        "ValidatingWebhookConfiguration"
    ]
    odd = CliRunner().invoke(gpushare, [*base, "--url", "https://h:1/check"])
    assert odd.exit_code == 2 and "--steer-url https://HOST:PORT/mutate" in odd.output
    named = CliRunner().invoke(
        gpushare,
        [*base, "--url", "https://h:1/check", "--steer-url", "https://h:2/m", "--steer-from", "x"],
    )
    assert named.exit_code == 0, named.output
    _, steering = yaml.safe_load_all(named.output)
    (steer,) = steering["webhooks"]
    assert steer["clientConfig"]["url"] == "https://h:2/m"
    assert steer["matchConditions"][0]["expression"].endswith('in ["x"]')


def test_webhook_config_sends_pods_setting_nvidia_visible_devices_only_where_refused(
    tmp_path: Path,
) -> None:
    """The configuration takes the server's rule flags, so what it sends is what is judged."""
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    base = ["webhook-config", "--url", "https://127.0.0.1:9443/validate", "--ca-bundle-file",
            str(ca), "--no-steer", "--mem-resource", "example.com/vram"]  # fmt: skip

    def condition(*flags: str) -> str:
        result = CliRunner().invoke(gpushare, [*base, *flags])
        assert result.exit_code == 0, result.output
        (hook,) = yaml.safe_load(result.output)["webhooks"]
        (must_see,) = [c for c in hook["matchConditions"] if c["name"] == "gpushare-must-see"]
        expression: str = must_see["expression"]
        assert "example.com/vram" in expression  # the names given, not the defaults
        return expression

    assert "NVIDIA_VISIBLE_DEVICES" not in condition("--nvidia-visible-devices", "allow")
    for flags in (
        (),  # auto beside cdi-cri: refused from unprivileged containers
        ("--device-list-strategy", "envvar"),
        ("--nvidia-visible-devices", "refuse"),
    ):
        expression = condition(*flags)
        assert "'NVIDIA_VISIBLE_DEVICES'" in expression
        assert (
            '["kube-system","gpu-operator","nvidia-gpu-operator","nvidia-device-plugin"]'
            in expression
        ), expression
    listed = condition("--nvidia-visible-devices=refuse",
                       "--nvidia-visible-devices-exempt-namespace=gpu-ops")  # fmt: skip
    assert '!(request.namespace in ["gpu-ops"])' in listed
    bad = CliRunner().invoke(gpushare, [*base, "--nvidia-visible-devices-exempt-namespace", " "])
    assert bad.exit_code == 2 and "exempt namespace ' ' is not a namespace name" in bad.output


def test_steer_tolerations_send_pods_naming_gpushare_too_and_bad_ones_are_refused(
    tmp_path: Path,
) -> None:
    """``--steer-toleration`` (the chart's webhook.steer.tolerations): the configuration also
    sends GPU pods naming gpushare's scheduler, and the server refuses a bad toleration."""
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    base = ["webhook-config", "--ca-bundle-file", str(ca), "--url", "https://h:1/validate"]
    result = CliRunner().invoke(gpushare, [*base, "--steer-toleration", "nvidia.com/gpu"])
    assert result.exit_code == 0, result.output
    _, steering = yaml.safe_load_all(result.output)
    condition = steering["webhooks"][0]["matchConditions"][0]["expression"]
    assert condition.endswith('in ["default-scheduler","ack-co-scheduler"]')
    bad = CliRunner().invoke(gpushare, [*base, "--steer-toleration", "gpu:Never"])
    assert bad.exit_code == 2 and "effect='Never' is not one of" in bad.output
    cert = tmp_path / "tls.crt"
    cert.write_text("x")
    served = CliRunner().invoke(
        gpushare,
        ["webhook", "--tls-cert-file", str(cert), "--tls-private-key-file", str(cert),
         "--steer-toleration", '{"key": "k", "operator": "Exists", "value": "v"}'],
    )  # fmt: skip
    assert served.exit_code == 2
    assert "--steer-toleration" in served.output and "Exists takes no value" in served.output
