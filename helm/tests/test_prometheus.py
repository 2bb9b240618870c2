"""The Grafana dashboard's and the Prometheus adapter's queries against a real Prometheus scraping a real server.

The test starts recserve on the test fixture's repository (rank, recall and the fixture's recommend pipeline), a
Prometheus server (Debian's `prometheus` package, the one that brings promtool) that scrapes it every second
with the `namespace` and `pod` labels a ServiceMonitor adds, sends a short mixed load (every endpoint and
protocol, ids outside `default` vocabularies, bursts the small queue refuses), waits until Prometheus has
scraped the server's final counts, and evaluates through Prometheus's HTTP API every PromQL expression of the
dashboard (its panels and its template variables) and of the adapter rules. Any expression that errors or
returns no series fails the test; so does a query of traffic this load drives that returns only zeros. The
exceptions: the GPU memory panel, whose metric exists only where tables live on a GPU, and the Redis tier's
panels, whose metrics exist only for models with a `tier = "redis"` table: on this server (CPU, no Redis tier)
they must return nothing (and must not error). Both processes are stopped by their PID.

The server runs with `--model-control explicit`, so the load also drives a model load that fails (a model
directory whose `model.toml` does not parse, added after start) and a connection closed for its slow request head.
The chart's alert rules (its PrometheusRule) are evaluated too: as the chart renders them by default they must
evaluate without error; with their thresholds at 0 the latency, 429 and load-failure alerts must fire on this
load, the Redis tier's must stay silent (no tier), and the down alert's selector must find the scraped target.

The table of every expression with its series count is printed (and written to `$RECSERVE_PROMETHEUS_REPORT`
when that is set).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT, load_values, merge, render, server_binary
from test_observability import adapter_rules, alert_rules, dashboard, exprs

# Grafana's variables as a dashboard over every namespace and model fills them. `$__rate_interval` is at least
# four scrape intervals; the load lasts longer than this window, so every rate sees it.
GRAFANA = {"$__rate_interval": "30s", "$namespace": ".*", "$model": ".*"}
# What the adapter's templates become for the pods of one release (as in test_observability).
ADAPTER = {"<<.LabelMatchers>>": 'namespace="serving",pod=~"recserve-.*"', "<<.GroupBy>>": "pod"}
# The labels a ServiceMonitor puts on every scraped series.
TARGET_LABELS = {"namespace": "serving", "pod": "recserve-0"}
# Only GPU builds with tables on a GPU export it.
GPU_ONLY = {"recserve_gpu_memory_bytes"}
# Only models with a `tier = "redis"` table export them; the fixture has none (the Rust tests start a Redis
# Cluster for the tier, this test does not).
REDIS_TIER = {
    "recserve_embedding_cache_lookups_total",
    "recserve_embedding_tier_fetch_duration_seconds",
    "recserve_embedding_tier_rows_fetched_total",
    "recserve_embedding_tier_errors_total",
    "recserve_embedding_update_visible_seconds",
    "recserve_embedding_update_errors_total",
    "recserve_embedding_update_following",
}
# Series this load cannot be relied on to move: a gauge of the instant (the queue is empty when the load has
# ended), requests dropped in the queue (expired or abandoned), which need the scheduler's timing to line up,
# connections refused at --max-connections (the load stays below it), and IVF queries cut by max_candidates (the
# fixture's recall models have no IVF index).
MAY_BE_ZERO = {
    "recserve_queue_depth",
    "recserve_expired_total",
    "recserve_abandoned_total",
    "recserve_connections_refused_total",
    "recserve_recall_index_capped_total",
}
LOAD_SECONDS = 8.0
QUEUE_CAPACITY = 4
HEADER_TIMEOUT_MS = 300
ADMIN_TOKEN = "prometheus-test"
# A model directory added after start whose load fails (`recserve_model_loads_total{outcome="invalid_model"}`).
BROKEN_MODEL = "broken"


def fixture_dir() -> Path:
    fixture = Path(os.environ.get("RECSERVE_TEST_FIXTURE", ROOT / "target" / "test-fixture"))
    if not (fixture / "repo").is_dir() or not Path(os.environ.get("ORT_DYLIB_PATH", "")).is_file():
        pytest.fail("needs the test fixture and ONNX Runtime: run scripts/check-helm.sh (or scripts/test.sh)")
    return fixture


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(url: str, body: Any = None, headers: dict[str, str] | None = None, timeout: float = 30.0) -> Any:
    """(status, parsed JSON or text) of a GET, or of a JSON POST when `body` is given."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            status, text = response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


def wait_for(what: str, check: Any, process: subprocess.Popen[bytes], log: Path, seconds: float = 60.0) -> None:
    """Polls `check()` until it is true; fails with the process's log if it exits or the time runs out."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{what}: the process exited ({process.returncode}):\n{log.read_text()}")
        try:
            if check():
                return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.1)
    pytest.fail(f"{what}: not within {seconds:.0f} s:\n{log.read_text()[-4000:]}")


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM by PID, then SIGKILL if it has not exited within 30 s."""
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()


@dataclass
class Running:
    server: str
    prometheus: str


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("no prometheus binary: install Debian's prometheus package (scripts/test.sh does)")
    fixture = fixture_dir()
    tmp = tmp_path_factory.mktemp("prometheus")
    # The fixture's models, linked into a repository this test may add a model to.
    repo = tmp / "repo"
    repo.mkdir()
    for model in (fixture / "repo").iterdir():
        (repo / model.name).symlink_to(model)
    (tmp / "token").write_text(ADMIN_TOKEN)
    http = free_port()
    server_log = tmp / "recserve.log"
    with server_log.open("w") as out:
        server = subprocess.Popen(
            [
                str(server_binary()),
                "serve",
                "--repository",
                str(repo),
                "--config",
                str(fixture / "recserve.toml"),
                "--http-addr",
                f"127.0.0.1:{http}",
                "--grpc-addr",
                "127.0.0.1:0",
                "--queue-capacity",
                str(QUEUE_CAPACITY),
                "--model-control",
                "explicit",
                "--admin-token-file",
                str(tmp / "token"),
                "--header-read-timeout-ms",
                str(HEADER_TIMEOUT_MS),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    prometheus = None
    try:
        base = f"http://127.0.0.1:{http}"
        wait_for("recserve ready", lambda: request(base + "/health/ready")[0] == 200, server, server_log)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {
                    "job_name": "recserve",
                    "static_configs": [{"targets": [f"127.0.0.1:{http}"], "labels": TARGET_LABELS}],
                }
            ],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        prometheus_log = tmp / "prometheus.log"
        with prometheus_log.open("w") as out:
            prometheus = subprocess.Popen(
                [
                    binary,
                    f"--config.file={tmp / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        api = f"http://127.0.0.1:{port}"
        wait_for("prometheus ready", lambda: request(api + "/-/ready")[0] == 200, prometheus, prometheus_log)
        wait_for("the first scrape", lambda: scalar(api, 'up{job="recserve"}') == 1.0, prometheus, prometheus_log)
        fail_a_load(base, repo)
        time_out_a_connection(http)
        load(base, fixture)
        # Prometheus has the final counts once its sum equals the server's own.
        total = served_requests(base)
        wait_for(
            f"a scrape that holds all {total:.0f} requests",
            lambda: scalar(api, "sum(recserve_requests_total)") == total,
            prometheus,
            prometheus_log,
            seconds=30,
        )
        yield Running(server=base, prometheus=api)
    finally:
        if prometheus is not None:
            stop(prometheus)
        stop(server)


def served_requests(base: str) -> float:
    _, text = request(base + "/metrics")
    lines = [line for line in text.splitlines() if line.startswith("recserve_requests_total{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def query(api: str, expr: str) -> list[dict[str, Any]]:
    """The instant vector of `expr` now; an error of Prometheus fails the test with its message."""
    status, body = request(api + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert status == 200 and body.get("status") == "success", f"{expr}: {body}"
    result = body["data"]
    assert result["resultType"] == "vector", f"{expr}: a {result['resultType']}, not an instant vector"
    return result["result"]


def scalar(api: str, expr: str) -> float | None:
    result = query(api, expr)
    return float(result[0]["value"][1]) if result else None


# --- the load ----------------------------------------------------------------------------------------------


def jobs(fixture: Path) -> list[tuple[str, Any, dict[str, str]]]:
    """(path, body, headers) of every request of the load: the fixture's rank, recall and recommend cases (each
    answered 200), the KServe v2 twins of some, and ids outside `default` vocabularies (oov counts)."""
    cases = json.loads((fixture / "cases.json").read_text())
    recall = json.loads((fixture / "recall-cases.json").read_text())
    out: list[tuple[str, Any, dict[str, str]]] = []
    for case in cases["cases"]:
        if case["version"] == cases["models"][case["model"]]["served_version"]:
            out.append((f"/v1/models/{case['model']}/rank", case["request"], {}))
    for case in recall["recall_cases"]:
        out.append((f"/v1/models/{case['model']}/recall", case["request"], {}))
    name = recall["pipeline"]["name"]
    for case in recall["recommend_cases"]:
        out.append((f"/v1/recommend/{name}", case["request"], {}))
    users = {"name": "user_id", "datatype": "INT64", "shape": [2], "data": [0, 1]}
    out.append(("/v2/models/lightgcn/infer", {"inputs": [users]}, {}))
    out.append(("/v2/models/lightgcn-int8/infer", {"inputs": [users], "parameters": {"k": 5}}, {}))
    return out


def load(base: str, fixture: Path) -> None:
    """A burst the queue of QUEUE_CAPACITY refuses in part (429 queue_full), LOAD_SECONDS of the fixture's requests
    from four threads, then another burst. Refusals before and after the steady load: a counter's series appears
    with its first increment, which rate() cannot see, so the 429 series must already exist when later ones come."""
    work = jobs(fixture)
    statuses: dict[int, int] = {}
    lock = threading.Lock()

    def client(offset: int, until: float, path_filter: str | None = None) -> None:
        i = offset
        while time.monotonic() < until:
            path, body, headers = work[i % len(work)]
            i += 1
            if path_filter and not path.startswith(path_filter):
                continue
            status, _ = request(base + path, body, headers)
            with lock:
                statuses[status] = statuses.get(status, 0) + 1

    # The largest rank requests from many clients at once, on one model.
    big = max((j for j in work if "/rank" in j[0]), key=lambda j: len(j[1]["candidates"]))

    def refuse_some() -> list[int]:
        burst_statuses: list[int] = []
        # Every burst thread sends at once: started one after another, they would reach a fast server one at a
        # time.
        together = threading.Barrier(6 * QUEUE_CAPACITY)

        def burst() -> None:
            together.wait()
            status, _ = request(base + big[0], big[1])
            with lock:
                burst_statuses.append(status)

        for _ in range(3):
            threads = [threading.Thread(target=burst) for _ in range(6 * QUEUE_CAPACITY)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if 429 in burst_statuses:
                break
        return burst_statuses

    before = refuse_some()
    end = time.monotonic() + LOAD_SECONDS
    threads = [threading.Thread(target=client, args=(i * 7, end)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = refuse_some()
    assert statuses.get(200, 0) > 100, f"the load got {statuses}"
    # The small queue may refuse a request of the steady load too (a large one takes several slots).
    assert set(statuses) <= {200, 429}, f"the fixture's cases answer 200 (or 429 when the queue is full): {statuses}"
    assert 429 in before and 429 in after, f"a burst was not refused: {before}, {after}"


def fail_a_load(base: str, repo: Path) -> None:
    """A model directory whose model.toml does not parse, loaded through the repository API: refused with 400."""
    version = repo / BROKEN_MODEL / "1"
    version.mkdir(parents=True)
    (version / "model.toml").write_text("format_version = [\n")
    status, body = request(
        f"{base}/v2/repository/models/{BROKEN_MODEL}/load", {}, {"authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    assert status == 400, f"loading {BROKEN_MODEL}: {status} {body}"


def time_out_a_connection(port: int) -> None:
    """A request head that never completes: the server closes the connection after --header-read-timeout-ms."""
    with socket.create_connection(("127.0.0.1", port), timeout=10 + HEADER_TIMEOUT_MS / 1000) as s:
        s.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        # EOF, or whatever the server answers (a 408) followed by EOF.
        while s.recv(4096):
            pass
        assert time.monotonic() - started >= HEADER_TIMEOUT_MS / 1000 * 0.9, "closed before the header timeout"


# --- the expressions ---------------------------------------------------------------------------------------


@dataclass
class Expression:
    source: str  # where it comes from: a panel, a variable, an adapter rule
    expr: str


def dashboard_expressions() -> list[Expression]:
    out = []
    titles = {p["id"]: p["title"] for p in dashboard()["panels"]}
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in GRAFANA.items():
                expr = expr.replace(variable, value)
            out.append(Expression(f"panel {panel['id']} {titles[panel['id']]!r} {target['refId']}", expr))
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        # label_values(SELECTOR, LABEL) is Grafana's: the series of SELECTOR that carry LABEL.
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["query"]["query"])
        assert match, variable["query"]
        selector, label = match.groups()
        for name, value in GRAFANA.items():
            selector = selector.replace(name, value)
        with_label = selector[:-1] + f', {label}!=""}}' if selector.endswith("}") else selector + f'{{{label}!=""}}'
        out.append(Expression(f"variable ${variable['name']}", f"count by ({label}) ({with_label})"))
    assert len(out) == len(exprs()) + 2, "every panel target and both query variables"
    return out


def adapter_expressions() -> list[Expression]:
    out = []
    for rule in adapter_rules():
        name = rule["name"]["as"]
        (series,) = re.findall(r"^(recserve_[a-z0-9_]+)\{", rule["seriesQuery"])
        expr = rule["metricsQuery"].replace("<<.Series>>", series)
        for template, value in ADAPTER.items():
            expr = expr.replace(template, value)
        assert "<<" not in expr, expr
        out.append(Expression(f"adapter {name} seriesQuery", rule["seriesQuery"]))
        out.append(Expression(f"adapter {name} metricsQuery", expr))
    return out


def alert_expressions(**thresholds: Any) -> dict[str, str]:
    """Each alert of the chart's PrometheusRule (the prometheusrule value set, over `thresholds`) by name."""
    values = merge(load_values("prometheusrule"), {"prometheusRule": thresholds})
    return {rule["alert"]: rule["expr"] for rule in alert_rules(render(values))}


def metrics_of(expr: str) -> set[str]:
    return {re.sub(r"_(bucket|sum|count)$", "", m) for m in re.findall(r"\brecserve_[a-z0-9_]+\b", expr)}


def nonzero(result: list[dict[str, Any]]) -> int:
    values = [float(r["value"][1]) for r in result]
    return sum(1 for v in values if math.isfinite(v) and v != 0.0)


def test_every_dashboard_and_adapter_query_returns_series(running: Running, capsys: pytest.CaptureFixture) -> None:
    devices = {r["metric"]["device"] for r in query(running.prometheus, "recserve_model_info")}
    on_gpu = devices != {"cpu"}
    rows, problems = [], []
    for e in dashboard_expressions() + adapter_expressions():
        result = query(running.prometheus, e.expr)
        metrics = metrics_of(e.expr)
        if metrics & GPU_ONLY and not on_gpu:
            expected = "none (CPU server)"
            if result:
                problems.append(f"{e.source}: {len(result)} series of a GPU-only metric on a CPU server")
        elif metrics and metrics <= REDIS_TIER:
            expected = "none (no Redis tier)"
            if result:
                problems.append(f"{e.source}: {len(result)} series of the Redis tier on a server without one")
        elif metrics <= MAY_BE_ZERO:
            expected = "≥ 1"
            if not result:
                problems.append(f"{e.source}: no series for {e.expr}")
        else:
            expected = "≥ 1, one non-zero"
            if not result or not nonzero(result):
                problems.append(f"{e.source}: {len(result)} series, none finite and non-zero, for {e.expr}")
        rows.append((e.source, e.expr, len(result), nonzero(result), expected))
    width = max(len(r[0]) for r in rows)
    lines = [f"{'source':<{width}}  series  non-zero  required  expression"]
    lines += [f"{s:<{width}}  {n:>6}  {z:>8}  {x}  {expr}" for s, expr, n, z, x in rows]
    table = "\n".join(lines)
    report = os.environ.get("RECSERVE_PROMETHEUS_REPORT")
    if report:
        Path(report).write_text(table + "\n")
    with capsys.disabled():
        print(f"\nPrometheus queries ({len(rows)} expressions, server devices {sorted(devices)}):\n{table}")
    assert not problems, "\n".join(problems)


def test_the_alert_rules_evaluate_and_fire(running: Running, capsys: pytest.CaptureFixture) -> None:
    as_rendered = alert_expressions()
    # Thresholds this load exceeds (the latency SLA is a positive number of seconds: a microsecond).
    lowered = alert_expressions(
        latency={"p99Seconds": 1e-6}, refused={"ratio": 0}, embeddingTierErrors={"ratio": 0}
    )
    assert as_rendered.keys() == lowered.keys()
    assert lowered["RecserveHighP99Latency"] != as_rendered["RecserveHighP99Latency"], "the SLA is not a value"
    # The down alert fires on `up == 0`; the same selector with `== 1` must find the running server's target.
    assert as_rendered["RecserveDown"].endswith(" == 0")
    up = as_rendered["RecserveDown"].removesuffix(" == 0") + " == 1"
    fire = {"RecserveHighP99Latency", "RecserveRefusingRequests", "RecserveModelLoadFailed"}
    silent = {"RecserveEmbeddingTierErrors"}
    assert fire | silent | {"RecserveDown"} == lowered.keys(), "a new alert needs an expectation here"
    rows, problems = [], []
    for name, expr in as_rendered.items():
        rows.append((f"{name} (as rendered)", len(query(running.prometheus, expr)), expr))
    for name, expr in lowered.items():
        result = query(running.prometheus, expr)
        rows.append((f"{name} (thresholds 0)", len(result), expr))
        if name in fire and not result:
            problems.append(f"{name} does not fire with its threshold at 0: {expr}")
        if name in silent and result:
            problems.append(f"{name} fires on a server without a Redis tier: {result}")
        if name == "RecserveModelLoadFailed" and {r["metric"]["model"] for r in result} != {BROKEN_MODEL}:
            problems.append(f"{name} should name {BROKEN_MODEL} alone: {result}")
    result = query(running.prometheus, up)
    rows.append(("RecserveDown selector (== 1)", len(result), up))
    if len(result) != 1:
        problems.append(f"the down alert's selector finds {len(result)} targets, not the one scraped: {up}")
    width = max(len(r[0]) for r in rows)
    with capsys.disabled():
        print("\nAlert rules:\n" + "\n".join(f"{s:<{width}}  {n:>6}  {expr}" for s, n, expr in rows))
    assert not problems, "\n".join(problems)
