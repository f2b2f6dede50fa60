"""deploy/ for Kubernetes (issue 46, point 2b), checked offline: every manifest validates
against Kubernetes' own schemas (kubernetes-validate, strict), the NetworkPolicy lets kernel
pods reach only the proxy, DNS and the gateway's response port, and the pieces agree with
each other (ports, labels, namespaces) and with the bot's settings. Nothing here ran on a
real cluster: docs/deployment.md says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from slackinterp.egress.policy import parse_address

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
VERSION = "1.30.0"  # the oldest Kubernetes the manifests are meant for


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def manifests() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        if path.name.endswith("-values.yaml"):
            continue  # Helm values, not a resource
        for doc in documents(path):
            found[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return found


def test_every_manifest_validates_strictly() -> None:
    found = manifests()
    assert {"NetworkPolicy/slackinterp-kernels", "Service/slackinterp-egress"} <= set(found)
    for doc in found.values():
        for version in (VERSION, "1.37.0"):
            kubernetes_validate.validate(doc, version, strict=True)  # raises with the field


def test_kernel_pods_reach_only_the_proxy_dns_and_the_gateway() -> None:
    found = manifests()
    policy = found["NetworkPolicy/slackinterp-kernels"]["spec"]
    service = found["Service/slackinterp-egress"]
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}  # both default to deny
    # The kernel pods as Enterprise Gateway labels them (kernel-pod.yaml.j2).
    assert policy["podSelector"]["matchLabels"] == {
        "app": "enterprise-gateway",
        "component": "kernel",
    }
    allowed = []
    for rule in policy["egress"]:
        assert rule.get("to"), "an egress rule without `to` would allow every destination"
        assert rule.get("ports"), "an egress rule without ports would allow every port"
        allowed += [(p["protocol"], p["port"]) for p in rule["ports"]]
    assert sorted(allowed) == [("TCP", 53), ("TCP", 3128), ("TCP", 8877), ("UDP", 53)]
    proxy_rule = next(r for r in policy["egress"] if r["ports"][0]["port"] == 3128)
    bot = proxy_rule["to"][0]
    assert bot["podSelector"]["matchLabels"] == service["spec"]["selector"]
    assert bot["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": service["metadata"]["namespace"]
    }
    assert service["spec"]["ports"][0]["targetPort"] == 3128
    # In: only the gateway (the kernel's ZeroMQ ports).
    assert [r["from"][0]["podSelector"]["matchLabels"]["component"] for r in policy["ingress"]] == [
        "enterprise-gateway"
    ]


def test_the_gateway_values_keep_kernels_under_the_policy() -> None:
    values = yaml.safe_load((K8S / "enterprise-gateway-values.yaml").read_text())
    policy = manifests()["NetworkPolicy/slackinterp-kernels"]
    # One namespace for every kernel pod, the policy's: a namespace per kernel escapes it.
    assert values["kernel"]["shareGatewayNamespace"] is True
    assert policy["metadata"]["namespace"] == "enterprise-gateway"
    assert values["kernel"]["cullIdleTimeout"] > 1800  # the bot's idle reaper goes first
    assert values["kernel"]["defaultKernelName"] in values["kernel"]["allowedKernels"]
    ports = {p["name"]: p["port"] for p in values["service"]["ports"]}
    assert ports["http-response"] == 8877  # the port the policy lets kernels answer on


def test_the_kernel_image_and_the_documented_settings_agree() -> None:
    dockerfile = (DEPLOY / "kernel-image" / "Dockerfile").read_text()
    base = next(line for line in dockerfile.splitlines() if line.startswith("FROM "))
    assert ":" in base and not base.endswith(":latest")  # a pinned base
    assert "HTTP_PROXY" not in dockerfile.upper()  # each kernel gets its own, from the bot
    service = manifests()["Service/slackinterp-egress"]
    advertised = (
        f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc.cluster.local:"
        f"{service['spec']['ports'][0]['port']}"
    )
    parse_address(advertised, "SLACKINTERP_EGRESS_ADDRESS")
    guide = (ROOT / "docs" / "deployment.md").read_text()
    assert f"SLACKINTERP_EGRESS_ADDRESS={advertised}" in guide
    assert "SLACKINTERP_EGRESS_LISTEN=0.0.0.0:3128" in guide
    assert "not run on a real cluster" in guide
