"""The chart against the real server: the arguments, environment and config file it renders are ones
`recserve check-config` accepts, with the values the chart meant; its ports and probe paths are the server's;
and a server started exactly as the pod would start it answers the probes, serves /metrics where the
ServiceMonitor looks, and drains within the pod's grace period."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    VALUE_SETS,
    Rendered,
    container_env,
    dockerfile_env,
    expand,
    load_values,
    localize,
    materialize_config_mounts,
    merge,
    render,
    server_binary,
)


def supports(flag: str) -> bool:
    help_text = subprocess.run([server_binary(), "serve", "--help"], capture_output=True, text=True, check=True).stdout
    return flag in help_text


# Settings the chart can write that need a newer server than some branches have: checked once the binary has them.
NEWER_SETTINGS = {
    "grpc_addr": "--grpc-addr",
    "device": "--device",
    "otlp_endpoint": "--otlp-endpoint",
    "access_log_sample_ratio": "--access-log-sample-ratio",
}


def pod_command(r: Rendered, tmp: Path) -> tuple[list[str], dict[str, str]]:
    """The server's argv (after the image's ENTRYPOINT) and environment, with the chart's ConfigMaps written
    under `tmp` and their mount paths mapped there."""
    server = r.server
    assert "command" not in server, "the chart relies on the image's ENTRYPOINT (recserve)"
    env = container_env(server)
    mapping = materialize_config_mounts(r, tmp)
    args = [localize(expand(a, env), mapping) for a in server["args"]]
    # What the image provides: the ONNX Runtime library (Dockerfile ENV), a PATH.
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "ORT_DYLIB_PATH": dockerfile_env("ORT_DYLIB_PATH")}
    return args, {**base, **env}


def check_config(r: Rendered, tmp: Path) -> dict[str, Any]:
    args, env = pod_command(r, tmp)
    assert args[0] == "serve"
    result = subprocess.run(
        # The image's repository and ONNX Runtime paths do not exist here: the settings alone.
        [server_binary(), "check-config", "--settings-only", *args[1:]],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, f"recserve check-config --settings-only {' '.join(args[1:])} refused: {result.stderr}"
    return tomllib.loads(result.stdout)


def port_of(addr: str) -> int:
    return int(addr.rsplit(":", 1)[1])


def overrides(r: Rendered) -> dict[str, str]:
    """Settings given as flags (server.extraArgs) or RECSERVE_* variables (server.env), by config key: they win
    over the config file."""
    found: dict[str, str] = {}
    for item in r.server.get("env", []):
        if item["name"].startswith("RECSERVE_"):
            found[item["name"].removeprefix("RECSERVE_").lower()] = item["value"]
    args = r.server["args"]
    for i, arg in enumerate(args):
        if arg.startswith("--") and arg != "--config":
            flag, _, value = arg.partition("=")
            found[flag.removeprefix("--").replace("-", "_")] = value or args[i + 1]
    return found


@pytest.mark.parametrize("name", VALUE_SETS)
def test_server_accepts_what_the_chart_passes(name: str, rendered: dict[str, Rendered], tmp_path: Path) -> None:
    r = rendered[name]
    config_file = r.one("ConfigMap", r.volume("config")["configMap"]["name"])["data"]["recserve.toml"]
    newer = [flag for key, flag in NEWER_SETTINGS.items() if f"\n{key} =" in config_file and not supports(flag)]
    if newer:
        pytest.skip(f"this recserve has no {', '.join(newer)}: the value set needs a newer server")

    resolved = check_config(r, tmp_path)

    # Every setting the chart wrote reaches the server with its value and type, unless a flag or env overrides it.
    wanted = {**{k: v for k, v in r.merged["config"].items() if v is not None}, **overrides(r)}
    for key, value in wanted.items():
        got = resolved[key]
        if isinstance(value, str) and not isinstance(got, str):
            got = str(got)
        assert got == value, f"{key}: the chart meant {value!r}, the server resolved {got!r}"

    # Tracing (tracing.*) reaches the server; without an endpoint it stays off.
    tracing = r.merged.get("tracing", {})
    if tracing.get("otlpEndpoint"):
        assert resolved["otlp_endpoint"] == tracing["otlpEndpoint"]
        assert resolved["trace_sample_ratio"] == pytest.approx(tracing["sampleRatio"])
    else:
        assert "otlp_endpoint" not in resolved
    assert resolved.get("access_log_sample_ratio", 0.0) == pytest.approx(tracing.get("accessLogSampleRatio", 0))

    # The ports the pod, the probes and the Service use are the ones the server listens on.
    assert port_of(resolved["http_addr"]) == r.container_port("http")
    # recserve always serves gRPC (--grpc-addr, default :8001); the chart exposes it only with server.grpc.enabled.
    if r.container_port("grpc") is not None:
        assert r.container_port("grpc") == port_of(resolved["grpc_addr"])
    # The repository is where the chart mounts it; ONNX Runtime is where the image puts it.
    assert resolved["repository"] == r.mount("models")["mountPath"]
    assert resolved["ort_library"] == dockerfile_env("ORT_DYLIB_PATH")
    # SIGKILL comes after the preStop sleep and the server's whole drain.
    pre_stop = r.server.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    assert r.pod["terminationGracePeriodSeconds"] >= pre_stop + resolved["shutdown_timeout_s"]
    assert resolved["shutdown_timeout_s"] == r.merged["server"]["shutdownTimeoutSeconds"]


@pytest.mark.parametrize("name", VALUE_SETS)
def test_probes_and_ports_are_the_servers(name: str, rendered: dict[str, Rendered]) -> None:
    r = rendered[name]
    server = r.server
    tls = bool(r.merged["tls"]["existingSecret"])
    kinds = ("startup", "readiness", "liveness")
    if tls and r.merged["tls"]["clientCA"]:
        # Mutual TLS: the kubelet has no client certificate, so it can only see that the port accepts.
        assert {kind: server[f"{kind}Probe"].get("tcpSocket") for kind in kinds} == dict.fromkeys(kinds, {"port": "http"})
        assert not any("httpGet" in server[f"{kind}Probe"] for kind in kinds)
    else:
        # Over TLS the probes speak HTTPS to the same paths.
        scheme = {"scheme": "HTTPS"} if tls else {}
        probes = {kind: server[f"{kind}Probe"]["httpGet"] for kind in kinds}
        assert probes == {
            "startup": {"path": "/health/ready", "port": "http", **scheme},
            "readiness": {"path": "/health/ready", "port": "http", **scheme},
            "liveness": {"path": "/health/live", "port": "http", **scheme},
        }
    service = r.one("Service")
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert ports["http"]["targetPort"] == "http" and ports["metrics"]["targetPort"] == "http"
    assert ("grpc" in ports) == (r.container_port("grpc") is not None)
    if "grpc" in ports:
        assert ports["grpc"]["targetPort"] == "grpc"
    monitor = r.maybe("ServiceMonitor")
    if monitor:
        assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
        assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
        assert monitor["spec"]["endpoints"][0].get("scheme", "http") == ("https" if tls else "http")
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert service["spec"]["selector"].items() <= r.deployment["spec"]["template"]["metadata"]["labels"].items()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_pod_as_rendered_starts_answers_its_probes_and_drains(tmp_path: Path) -> None:
    """The default value set, on a free port (the one thing changed), against the test fixture's repository."""
    fixture = Path(os.environ.get("RECSERVE_TEST_FIXTURE", Path(__file__).parents[2] / "target" / "test-fixture"))
    ort = os.environ.get("ORT_DYLIB_PATH", "")
    if not (fixture / "repo").is_dir() or not Path(ort).is_file():
        pytest.fail("needs the test fixture and ONNX Runtime: run scripts/check-helm.sh (or scripts/test.sh)")
    port = free_port()
    r = render(merge(load_values("default"), {"server": {"httpPort": port}}))
    args, env = pod_command(r, tmp_path)
    # The volumes the image and the cluster provide, here: the repository the chart mounts at /models is the
    # fixture's, the ONNX Runtime library is the one the tests use.
    env |= {"RECSERVE_REPOSITORY": str(fixture / "repo"), "ORT_DYLIB_PATH": ort}
    # recserve always serves gRPC (default :8001); this value set does not expose it, so a free port too.
    env |= {"RECSERVE_GRPC_ADDR": "127.0.0.1:0"}
    base = f"http://127.0.0.1:{r.container_port('http')}"
    probe = {kind: r.server[f"{kind}Probe"] for kind in ("startup", "readiness", "liveness")}
    log = (tmp_path / "server.log").open("w")
    process = subprocess.Popen([server_binary(), *args], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        # The startup probe's budget, capped: the fixture loads in about a second.
        budget = min(probe["startup"]["periodSeconds"] * probe["startup"]["failureThreshold"], 60)
        deadline = time.monotonic() + budget
        status = None
        while time.monotonic() < deadline and process.poll() is None:
            try:
                status, _ = get(base + probe["startup"]["httpGet"]["path"])
            except (ConnectionError, urllib.error.URLError):
                status = None
            if status == 200:
                break
            time.sleep(0.1)
        assert status == 200, f"startup probe never passed; server log:\n{(tmp_path / 'server.log').read_text()}"
        assert get(base + probe["readiness"]["httpGet"]["path"]) == (200, '{"status":"ready"}')
        assert get(base + probe["liveness"]["httpGet"]["path"]) == (200, '{"status":"live"}')
        # What the ServiceMonitor scrapes: port "metrics" of the Service, which targets the container port "http".
        status, metrics = get(base + "/metrics")
        assert status == 200 and "recserve_model_info{" in metrics and "recserve_build_info{" in metrics
        status, models = get(base + "/v1/models")
        assert status == 200 and '"models"' in models

        # Kubernetes sends SIGTERM after the preStop sleep; the server must be gone before SIGKILL.
        pre_stop = r.server["lifecycle"]["preStop"]["sleep"]["seconds"]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=r.pod["terminationGracePeriodSeconds"] - pre_stop) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()


def test_pod_with_tls_and_tokens_answers_its_probes_over_https(tmp_path: Path) -> None:
    """The tls value set as the pod would start it, its Secrets written where the chart mounts them (a certificate
    made here with openssl): the probes answer over HTTPS, as the kubelet asks them; inference needs a token."""
    fixture = Path(os.environ.get("RECSERVE_TEST_FIXTURE", Path(__file__).parents[2] / "target" / "test-fixture"))
    ort = os.environ.get("ORT_DYLIB_PATH", "")
    if not (fixture / "repo").is_dir() or not Path(ort).is_file():
        pytest.fail("needs the test fixture and ONNX Runtime: run scripts/check-helm.sh (or scripts/test.sh)")
    port = free_port()
    r = render(merge(load_values("tls"), {"server": {"httpPort": port}}))
    secrets = {"tls": tmp_path / "tls", "inference-tokens": tmp_path / "tokens"}
    for directory in secrets.values():
        directory.mkdir()
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", str(secrets["tls"] / "tls.key"), "-out", str(secrets["tls"] / "tls.crt")],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    (secrets["inference-tokens"] / "tokens").write_text("probe-test-token\n")
    args, env = pod_command(r, tmp_path)
    mounts = {r.mount(volume)["mountPath"]: local for volume, local in secrets.items()}
    args = [localize(a, mounts) for a in args]
    env |= {"RECSERVE_REPOSITORY": str(fixture / "repo"), "ORT_DYLIB_PATH": ort, "RECSERVE_GRPC_ADDR": "127.0.0.1:0"}
    context = ssl.create_default_context(cafile=str(secrets["tls"] / "tls.crt"))
    base = f"https://localhost:{r.container_port('http')}"

    def fetch(path: str, token: str | None = None) -> tuple[int, str]:
        request = urllib.request.Request(base + path)
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=5, context=context) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    probe = {kind: r.server[f"{kind}Probe"]["httpGet"] for kind in ("startup", "readiness", "liveness")}
    assert {p["scheme"] for p in probe.values()} == {"HTTPS"}
    log = (tmp_path / "server.log").open("w")
    process = subprocess.Popen([server_binary(), *args], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        status = None
        while time.monotonic() < deadline and process.poll() is None:
            try:
                status, _ = fetch(probe["startup"]["path"])
            except (ConnectionError, urllib.error.URLError, ssl.SSLError):
                status = None
            if status == 200:
                break
            time.sleep(0.1)
        assert status == 200, f"startup probe never passed over HTTPS; log:\n{(tmp_path / 'server.log').read_text()}"
        assert fetch(probe["readiness"]["path"]) == (200, '{"status":"ready"}')
        assert fetch(probe["liveness"]["path"]) == (200, '{"status":"live"}')
        status, metrics = fetch("/metrics")
        assert status == 200 and "recserve_auth_refused_total" in metrics
        assert fetch("/v1/models")[0] == 401
        assert fetch("/v1/models", "probe-test-token")[0] == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
