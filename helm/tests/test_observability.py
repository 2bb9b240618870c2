"""The Grafana dashboard, the Prometheus adapter rules and the chart's alert rules (PrometheusRule): their PromQL
parses (promtool), they name metrics the server exports, the dashboard shows what an operator needs (traffic,
latency per stage, batching, queue, refusals, errors, connections, pipelines, model loads, the Redis tier, OOV ids,
GPU memory), and every alert says how long, how bad, which model and where to look."""

from __future__ import annotations

import copy
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml
from conftest import CHART, ROOT, Rendered, tool

DASHBOARD = CHART / "dashboards" / "recserve.json"
ADAPTER_VALUES = ROOT / "helm" / "prometheus-adapter-values.yaml"

# Metrics the dashboard already charts that the server on this branch does not export yet; their panels stay
# empty until then (none at present: helm/tests/test_prometheus.py runs every query on a real Prometheus).
PENDING_METRICS: set[str] = set()


def exported_metrics() -> set[str]:
    """Every metric name the server's code defines (core/src/metrics/, and any other file of either crate)."""
    sources = "\n".join(p.read_text() for d in ("src", "core/src") for p in (ROOT / d).rglob("*.rs"))
    return set(re.findall(r'"(recserve_[a-z0-9_]+)"', sources))


def metric_names(expr: str) -> set[str]:
    return {re.sub(r"_(bucket|sum|count)$", "", m) for m in re.findall(r"\brecserve_[a-z0-9_]+\b", expr)}


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def exprs() -> list[str]:
    return [t["expr"] for p in panels() for t in p["targets"]]


def promtool_check(queries: dict[str, str], tmp_path: Path) -> None:
    """Parses each query as promtool parses rule files."""
    rules = {"groups": [{"name": "check", "rules": [{"record": f"check:{n}", "expr": q} for n, q in queries.items()]}]}
    file = tmp_path / "rules.yaml"
    file.write_text(yaml.safe_dump(rules))
    result = subprocess.run([tool("promtool"), "check", "rules", str(file)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_queries_parse(tmp_path: Path) -> None:
    # Grafana's variables, as Grafana substitutes them.
    grafana = {"$__rate_interval": "1m", "$namespace": ".*", "$model": ".*"}
    queries = {}
    for i, expr in enumerate(exprs()):
        for variable, value in grafana.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, f"unknown variable in {expr}"
        queries[f"q{i}"] = expr
    promtool_check(queries, tmp_path)


def test_dashboard_names_metrics_the_server_exports() -> None:
    exported = exported_metrics()
    assert {"recserve_requests_total", "recserve_request_duration_seconds"} <= exported, "core/src/metrics/ not read"
    used = set().union(*(metric_names(e) for e in exprs()))
    unknown = used - exported - PENDING_METRICS
    assert not unknown, f"the dashboard queries metrics the server does not define: {sorted(unknown)}"
    arrived = PENDING_METRICS & exported
    if arrived:
        print(f"now exported, remove from PENDING_METRICS: {sorted(arrived)}")


def test_dashboard_shows_what_operators_need() -> None:
    text = " ".join(exprs())
    for metric in [
        "recserve_requests_total",  # QPS, status codes
        "recserve_batch_rows",  # batch size
        "recserve_queue_depth",
        "recserve_rejected_total",  # refusals
        "recserve_expired_total",
        "recserve_embedding_oov_total",
        "recserve_gpu_memory_bytes",
        "recserve_model_info",
    ]:
        assert metric in text, f"no panel shows {metric}"
    for metric in [
        "recserve_connections_open",
        "recserve_connections_timed_out_total",
        "recserve_connections_refused_total",
        "recserve_pipeline_stage_duration_seconds",
        "recserve_recall_index_capped_total",
        "recserve_model_loads_total",
        "recserve_embedding_cache_lookups_total",  # the row cache's hit ratio
        "recserve_embedding_tier_fetch_duration_seconds",
        "recserve_embedding_update_visible_seconds",  # online update lag
        "recserve_embedding_tier_errors_total",
    ]:
        assert metric in text, f"no panel shows {metric}"
    assert 'code!~"2.."' in text, "no panel shows the share of non-2xx responses"
    for stage in ["request", "queue", "gather", "inference", "topk"]:
        for quantile in ["0.5", "0.99"]:
            histogram = f"recserve_{stage}_duration_seconds_bucket"
            # The request latency also splits pipelines (recommend) from models.
            by = r"le, model, pipeline" if stage == "request" else r"le, model"
            pattern = rf"histogram_quantile\({quantile}, sum by \({by}\) \(rate\({histogram}"
            assert re.search(pattern, text), f"no p{quantile} of the {stage} stage"


def test_dashboard_is_well_formed() -> None:
    d = dashboard()
    assert d["uid"] == "recserve" and d["title"]
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    variables = {v["name"] for v in d["templating"]["list"]}
    assert variables == {"datasource", "namespace", "model"}
    for p in panels():
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"] and p["description"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
    # No two panels overlap on Grafana's 24-column grid.
    cells: set[tuple[int, int]] = set()
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"{p['title']} overlaps another panel"
        cells |= mine


def test_dashboard_configmap_carries_the_file(rendered: dict[str, Rendered]) -> None:
    r = rendered["servicemonitor"]
    (cm,) = [c for c in r.all("ConfigMap") if "recserve.json" in c.get("data", {})]
    assert json.loads(cm["data"]["recserve.json"]) == dashboard()
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    assert not [c for c in rendered["default"].all("ConfigMap") if "recserve.json" in c.get("data", {})]


def adapter_rules() -> list[dict[str, Any]]:
    return yaml.safe_load(ADAPTER_VALUES.read_text())["rules"]["custom"]


def test_adapter_rules_serve_the_hpa_metrics(rendered: dict[str, Rendered], tmp_path: Path) -> None:
    rules = {rule["name"]["as"]: rule for rule in adapter_rules()}
    hpa = rendered["hpa-prometheus"].one("HorizontalPodAutoscaler")
    wanted = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"}
    assert wanted and wanted <= rules.keys(), f"the HPA asks for {wanted}, the adapter serves {set(rules)}"

    exported = exported_metrics()
    queries = {}
    for name, rule in rules.items():
        (series,) = re.findall(r"^(recserve_[a-z0-9_]+)\{", rule["seriesQuery"])
        assert re.sub(r"_bucket$", "", series) in exported, series
        assert re.fullmatch(rule["name"]["matches"], series), rule["name"]
        assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
        # The adapter's templates, as it fills them for one pod.
        query = (
            rule["metricsQuery"]
            .replace("<<.Series>>", series)
            .replace("<<.LabelMatchers>>", 'namespace="serving",pod=~"recserve-.*"')
            .replace("<<.GroupBy>>", "pod")
        )
        assert "<<" not in query, query
        queries[name] = query
        queries[f"{name}_series"] = rule["seriesQuery"]
    promtool_check(queries, tmp_path)


def alert_rules(r: Rendered) -> list[dict[str, Any]]:
    """The alerting rules of the render's PrometheusRule."""
    return [rule for group in r.one("PrometheusRule")["spec"]["groups"] for rule in group["rules"]]


def test_alert_rules_pass_promtool(rendered: dict[str, Rendered], tmp_path: Path) -> None:
    """`promtool check rules` on the PrometheusRule's spec, which is a Prometheus rule file (groups of rules)."""
    spec = copy.deepcopy(rendered["prometheusrule"].one("PrometheusRule")["spec"])
    file = tmp_path / "alerts.yaml"
    file.write_text(yaml.safe_dump(spec))
    result = subprocess.run([tool("promtool"), "check", "rules", str(file)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules(rendered['prometheusrule']))} rules found" in result.stdout, result.stdout
    # The check is not vacuous: a broken expression fails it.
    spec["groups"][0]["rules"][0]["expr"] = "sum by (model (recserve_requests_total)"
    file.write_text(yaml.safe_dump(spec))
    assert subprocess.run([tool("promtool"), "check", "rules", str(file)], capture_output=True).returncode != 0


def test_alert_rules_say_what_to_look_at(rendered: dict[str, Rendered]) -> None:
    r = rendered["prometheusrule"]
    rules = alert_rules(r)
    values = r.merged["prometheusRule"]
    names = {rule["alert"] for rule in rules}
    assert names == {
        "RecserveHighP99Latency",
        "RecserveRefusingRequests",
        "RecserveModelLoadFailed",
        "RecserveEmbeddingTierErrors",
        "RecserveDown",
    }
    exported = exported_metrics()
    for rule in rules:
        assert rule.keys() == {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical") and rule["labels"]["team"] == "recsys"
        assert rule["annotations"].keys() == {"summary", "description"}, rule["alert"]
        # Which model (or, when a pod stops answering, which pod), and a pointer to the cause.
        who = "{{ $labels.pod }}" if rule["alert"] == "RecserveDown" else "{{ $labels.model }}"
        assert who in rule["annotations"]["summary"] and who in rule["annotations"]["description"], rule["alert"]
        assert "Look at" in rule["annotations"]["description"], rule["alert"]
        assert 'namespace="serving"' in rule["expr"], f"{rule['alert']} is not scoped to the release's namespace"
        assert metric_names(rule["expr"]) <= exported, rule["expr"]
    by_name = {rule["alert"]: rule for rule in rules}
    # The thresholds and durations are the values'.
    assert by_name["RecserveHighP99Latency"]["expr"].endswith(f"> {values['latency']['p99Seconds']}")
    assert by_name["RecserveHighP99Latency"]["for"] == values["latency"]["for"] == "5m"
    assert by_name["RecserveHighP99Latency"]["labels"]["severity"] == "critical"
    assert by_name["RecserveRefusingRequests"]["expr"].endswith(f"> {values['refused']['ratio']}")
    assert 'code="429"' in by_name["RecserveRefusingRequests"]["expr"]
    assert f"offset {values['loadFailures']['window']}" in by_name["RecserveModelLoadFailed"]["expr"]
    assert by_name["RecserveEmbeddingTierErrors"]["expr"].endswith(f"> {values['embeddingTierErrors']['ratio']}")
    assert 'job="recserve"' in by_name["RecserveDown"]["expr"], "the ServiceMonitor's job is the Service's name"
    assert r.one("PrometheusRule")["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert not rendered["default"].all("PrometheusRule"), "off by default"
