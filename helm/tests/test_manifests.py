"""The chart lints, renders with every value set in helm/recserve/ci/, and every rendered manifest is valid
against the Kubernetes 1.30 schemas (strict: unknown fields are errors). The Prometheus Operator's
ServiceMonitor is not a core kind: it is checked against the operator's own generated models instead."""

from __future__ import annotations

import copy
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
from cloudcoil.models.prometheus_operator.v1 import PrometheusRule, ServiceMonitor
from conftest import CHART, KUBE_VERSION, NAMESPACE, VALUE_SETS, Rendered, load_values, merge, render

# helm lint's severities: 1 info, 2 warning, 3 error.
WARNING = 2


def validate_service_monitor(doc: dict[str, Any]) -> None:
    """Against the prometheus-operator's ServiceMonitor model (generated from its CRD's OpenAPI schema). The model
    ignores unknown fields, so a field that does not survive the round trip is one the CRD does not have."""
    model = ServiceMonitor.model_validate(doc)
    assert model.model_dump(by_alias=True, exclude_unset=True, mode="json") == doc, (
        "the ServiceMonitor has fields its CRD does not define"
    )


def validate_prometheus_rule(doc: dict[str, Any]) -> None:
    """As the ServiceMonitor, against the operator's PrometheusRule model."""
    model = PrometheusRule.model_validate(doc)
    assert model.model_dump(by_alias=True, exclude_unset=True, mode="json") == doc, (
        "the PrometheusRule has fields its CRD does not define"
    )


# Kinds outside the core schemas, and how each is checked. A new one without an entry fails the test.
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): validate_service_monitor,
    ("monitoring.coreos.com/v1", "PrometheusRule"): validate_prometheus_rule,
}


def validate(doc: dict[str, Any]) -> None:
    try:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        check = CUSTOM_KINDS.get((doc["apiVersion"], doc["kind"]))
        if check is None:
            pytest.fail(f"no schema for {doc['apiVersion']} {doc['kind']}: add a validator to CUSTOM_KINDS")
        check(doc)


@pytest.mark.parametrize("name", VALUE_SETS)
def test_lints_clean(name: str) -> None:
    report = helm.lint(CHART, load_values(name), strict=True, kube_version=f"v{KUBE_VERSION}")
    problems = [m for m in report["messages"] if m["severity"] >= WARNING]
    assert not problems and not report["errors"], report


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_manifest_is_valid_kubernetes(name: str, rendered: dict[str, Rendered]) -> None:
    docs = rendered[name].docs
    assert docs, "nothing rendered"
    for doc in docs:
        try:
            validate(doc)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            pytest.fail(f"{name}: {doc['kind']}/{doc['metadata']['name']}: {path}: {e.message}")
        assert doc["metadata"].get("namespace", NAMESPACE) in (NAMESPACE, "monitoring"), doc["metadata"]


def test_the_required_variants_are_covered(rendered: dict[str, Rendered]) -> None:
    """The value sets exercise what the chart offers, so the schema check above sees each template."""
    kinds = {name: {d["kind"] for d in r.docs} for name, r in rendered.items()}
    default = rendered["default"]
    assert kinds["default"] == {"ConfigMap", "Deployment", "Pod", "PodDisruptionBudget", "Service", "ServiceAccount"}
    assert default.deployment["spec"]["replicas"] == 2
    assert "volumes" in default.pod and default.volume("models")["persistentVolumeClaim"] == {
        "claimName": "recserve-models",
        "readOnly": True,
    }

    gpu = rendered["gpu"]
    assert gpu.server["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in gpu.pod["tolerations"]
    assert gpu.pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert gpu.server["image"].endswith(":0.1.0-gpu")
    assert "nvidia.com/gpu" not in str(default.server.get("resources"))

    hpa = rendered["hpa-cpu"].one("HorizontalPodAutoscaler")
    assert [m["type"] for m in hpa["spec"]["metrics"]] == ["Resource"]
    assert "replicas" not in rendered["hpa-cpu"].deployment["spec"], "the HPA owns the replica count"
    prom = rendered["hpa-prometheus"].one("HorizontalPodAutoscaler")
    assert [m.get("pods", {}).get("metric", {}).get("name") for m in prom["spec"]["metrics"]] == [
        None,
        "recserve_requests_per_second",
        "recserve_request_duration_seconds_p99",
    ]

    assert {"ServiceMonitor", "ConfigMap"} <= kinds["servicemonitor"]
    assert len(rendered["servicemonitor"].all("ConfigMap")) == 2, "the config file and the dashboard"
    assert {"ServiceMonitor", "PrometheusRule"} <= kinds["prometheusrule"]
    assert all("PrometheusRule" not in k for name, k in kinds.items() if name != "prometheusrule"), "off by default"

    assert rendered["hostpath"].volume("models")["hostPath"] == {
        "path": "/var/lib/recserve/models",
        "type": "Directory",
    }

    init = rendered["init-container"]
    assert "emptyDir" in init.volume("models")
    (fetch,) = init.pod["initContainers"]
    assert any(
        m["name"] == "models" and m["mountPath"] == init.mount("models")["mountPath"] for m in fetch["volumeMounts"]
    )
    assert init.mount("models")["subPath"] == "repo" and init.mount("models")["readOnly"] is True

    assert "NetworkPolicy" in kinds["networkpolicy"]
    assert rendered["networkpolicy"].one("PodDisruptionBudget")["spec"] == {
        "minAvailable": "50%",
        "selector": rendered["networkpolicy"].deployment["spec"]["selector"],
    }
    assert rendered["default"].container_port("grpc") == 8001
    assert rendered["grpc"].container_port("grpc") is None

    # TLS and inference tokens: each Secret mounted read-only as a whole directory (no subPath, so that the kubelet
    # updates it and the server rereads it) and passed as the flags that read it.
    tls = rendered["tls"]
    args = tls.server["args"]
    for flag, value in [
        ("--tls-cert", "/etc/recserve-tls/tls.crt"),
        ("--tls-key", "/etc/recserve-tls/tls.key"),
        ("--inference-tokens-file", "/etc/recserve-tokens/tokens"),
    ]:
        assert args[args.index(flag) + 1] == value, args
    assert "--tls-client-ca" not in args
    for volume, path, secret, items in [
        ("tls", "/etc/recserve-tls", "recserve-tls", ["tls.crt", "tls.key"]),
        ("inference-tokens", "/etc/recserve-tokens", "recserve-tokens", ["tokens"]),
    ]:
        mount = tls.mount(volume)
        assert mount["mountPath"] == path and mount["readOnly"] is True and "subPath" not in mount
        assert tls.volume(volume)["secret"]["secretName"] == secret
        assert [i["path"] for i in tls.volume(volume)["secret"]["items"]] == items
    assert tls.one("ServiceMonitor")["spec"]["endpoints"][0]["tlsConfig"]["serverName"] == "recserve.serving.svc"
    mtls = rendered["mtls"]
    args = mtls.server["args"]
    assert args[args.index("--tls-client-ca") + 1] == "/etc/recserve-tls/ca.crt"
    assert [i["path"] for i in mtls.volume("tls")["secret"]["items"]] == ["tls.crt", "tls.key", "ca.crt"]
    for name, r in rendered.items():
        if name not in ("tls", "mtls"):
            assert not any(a.startswith("--tls") or a == "--inference-tokens-file" for a in r.server["args"]), name


def test_init_container_expands_the_source_and_target() -> None:
    r = render(load_values("init-container"))
    (fetch,) = r.pod["initContainers"]
    env = {e["name"]: e["value"] for e in fetch["env"]}
    assert env["MODEL_REPOSITORY_URI"] == "s3://example-models/recserve/2026-11-30/"
    assert env["MODEL_REPOSITORY_DIR"] == r.mount("models")["mountPath"]
    assert "$(MODEL_REPOSITORY_URI)" in fetch["command"] and "$(MODEL_REPOSITORY_DIR)" in fetch["command"]
    assert r.one("ServiceAccount")["metadata"]["annotations"] == {
        "eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/recserve-models-read"
    }


def test_config_file_keeps_types_and_tables() -> None:
    """Helm reads numbers as floats; the config file must still say `executors = 2`, which the server parses as an
    integer (`2.0` it refuses). Nested tables get dotted headers; null values are left out."""
    values = merge(
        load_values("default"),
        {
            "config": {
                "executors": 2,
                "max_body_bytes": 8388608,
                "ratio": 0.25,
                "name": 'a "b"',
                "x": None,
                "pin": {"deepfm-int8": 3, "with space": 1, "nested": {"deeper": True}},
            }
        },
    )
    toml = render(values).one("ConfigMap")["data"]["recserve.toml"]
    for line in [
        "executors = 2\n",
        "max_body_bytes = 8388608\n",
        "ratio = 0.25\n",
        'name = "a \\"b\\""\n',
        '[pin]\ndeepfm-int8 = 3\n"with space" = 1\n',
        "[pin.nested]\ndeeper = true\n",
    ]:
        assert line in toml, f"{line!r} not in\n{toml}"
    assert "\nx =" not in toml


def test_config_changes_roll_the_pods() -> None:
    base = load_values("default")
    a = render(base).deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    b = render(merge(base, {"config": {"executors": 3}})).deployment["spec"]["template"]["metadata"]["annotations"]
    assert a != b["checksum/config"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({}, "modelRepository.pvc.claimName is required"),
        ({"modelRepository": {"source": "hostPath"}}, "modelRepository.hostPath.path is required"),
        ({"modelRepository": {"source": "initContainer"}}, "modelRepository.initContainer.uri is required"),
        ({"modelRepository": {"source": "s3"}}, "modelRepository/source"),
        ({"replicaCont": 3}, "additional properties 'replicaCont' not allowed"),
        ({"config": {"http_addr": "0.0.0.0:9000"}}, "config.http_addr is set by the chart"),
        ({"config": {"repository": "/elsewhere"}}, "config.repository is set by the chart; use modelRepository"),
        ({"config": {"max-candidates": 2}}, "at '/config': additional properties 'max-candidates' not allowed"),
        ({"terminationGracePeriodSeconds": 20}, "terminationGracePeriodSeconds (20) must be at least"),
        ({"autoscaling": {"enabled": True, "cpu": {"enabled": False}}}, "autoscaling.enabled needs a metric"),
        (
            {"autoscaling": {"enabled": True}, "resources": {"requests": {"cpu": None}}},
            "autoscaling.cpu scales on a percentage of the CPU request",
        ),
        ({"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 3}}, "minReplicas (5) is above"),
        ({"podDisruptionBudget": {"minAvailable": 1}}, "set exactly one of maxUnavailable and minAvailable"),
        ({"server": {"httpPort": 0}}, "/server/httpPort"),
    ],
)
def test_refuses_bad_values_with_a_clear_message(values: dict[str, Any], message: str) -> None:
    if "modelRepository" not in values and values:
        values = merge(load_values("default"), values)
    with pytest.raises(helm.HelmError) as error:
        render(values)
    assert message in str(error.value)


def test_the_validators_catch_mistakes(rendered: dict[str, Rendered]) -> None:
    """Guards the check above against passing vacuously (a lax schema, an unknown kind let through)."""
    deployment = copy.deepcopy(rendered["default"].deployment)
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/health/ready"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)
    monitor = copy.deepcopy(rendered["servicemonitor"].one("ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["portName"] = "metrics"
    with pytest.raises(AssertionError, match="fields its CRD does not define"):
        validate(monitor)
    monitor["spec"]["endpoints"][0] = {"port": "metrics", "interval": "15 seconds"}
    with pytest.raises(ValueError, match="interval"):
        validate(monitor)
    rule = copy.deepcopy(rendered["prometheusrule"].one("PrometheusRule"))
    rule["spec"]["groups"][0]["rules"][0]["severity"] = "warning"
    with pytest.raises(AssertionError, match="fields its CRD does not define"):
        validate(rule)
    with pytest.raises(pytest.fail.Exception, match=r"no schema for example\.com/v1 Widget"):
        validate({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}})
