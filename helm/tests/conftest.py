"""Shared by the chart's tests: rendering the chart with the value sets in helm/recserve/ci/, and reading the
rendered manifests the way the kubelet would (container args, env, mounted ConfigMaps).

Run through scripts/check-helm.sh, which installs helm/requirements.txt into .venv-helm and builds the server.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "recserve"
VALUE_SETS = {p.name.removesuffix("-values.yaml"): p for p in sorted((CHART / "ci").glob("*-values.yaml"))}
RELEASE = "recserve"
NAMESPACE = "serving"
# The Kubernetes version the manifests are validated against (and the chart's minimum, Chart.yaml kubeVersion).
KUBE_VERSION = "1.30.0"


def load_values(name: str) -> dict[str, Any]:
    return yaml.safe_load(VALUE_SETS[name].read_text()) or {}


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`extra` over `base`, recursively, as Helm merges -f files and --set."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@dataclass
class Rendered:
    """The manifests of one render, by kind and name."""

    values: dict[str, Any]
    # The values the templates saw: the chart's values.yaml under `values`.
    merged: dict[str, Any]
    files: dict[str, str]
    docs: list[dict[str, Any]]

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [d for d in self.all(kind) if name is None or d["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, got {[d['metadata']['name'] for d in found]}"
        return found[0]

    def maybe(self, kind: str) -> dict[str, Any] | None:
        found = self.all(kind)
        return found[0] if found else None

    @property
    def deployment(self) -> dict[str, Any]:
        return self.one("Deployment")

    @property
    def pod(self) -> dict[str, Any]:
        return self.deployment["spec"]["template"]["spec"]

    @property
    def server(self) -> dict[str, Any]:
        containers = [c for c in self.pod["containers"] if c["name"] == "recserve"]
        assert len(containers) == 1, "the Deployment has one container named recserve"
        return containers[0]

    def container_port(self, name: str) -> int | None:
        ports = {p["name"]: p["containerPort"] for p in self.server.get("ports", [])}
        return ports.get(name)

    def volume(self, name: str) -> dict[str, Any]:
        (volume,) = [v for v in self.pod["volumes"] if v["name"] == name]
        return volume

    def mount(self, name: str) -> dict[str, Any]:
        (mount,) = [m for m in self.server["volumeMounts"] if m["name"] == name]
        return mount


def render(values: dict[str, Any]) -> Rendered:
    """Renders the chart offline as `helm install` would (values.schema.json is checked too)."""
    with helm.Chart.load(CHART) as chart:
        files = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
        merged = chart.merge_values(values)
    docs = []
    for path, text in sorted(files.items()):
        if path.endswith(".txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return Rendered(values=values, merged=merged, files=files, docs=docs)


@pytest.fixture(scope="session")
def rendered() -> dict[str, Rendered]:
    """Every value set of helm/recserve/ci/, rendered once."""
    return {name: render(load_values(name)) for name in VALUE_SETS}


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of command, args and env values: $$ escapes, unknown names stay as written."""
    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
        lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
        text,
    )


def container_env(container: dict[str, Any]) -> dict[str, str]:
    """The environment the container starts with (plain values; the chart sets no valueFrom for the server)."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        assert "valueFrom" not in item, f"env {item['name']} uses valueFrom, which this test cannot resolve"
        env[item["name"]] = expand(str(item.get("value", "")), env)
    assert not container.get("envFrom"), "envFrom cannot be resolved offline"
    return env


def materialize_config_mounts(r: Rendered, root: Path) -> dict[str, Path]:
    """Writes each ConfigMap mounted into the server container under `root`, as the kubelet would mount it, and
    returns {mountPath in the container: directory here}."""
    mapping: dict[str, Path] = {}
    for mount in r.server.get("volumeMounts", []):
        volume = r.volume(mount["name"])
        if "configMap" not in volume:
            continue
        data = r.one("ConfigMap", volume["configMap"]["name"])["data"]
        local = root / mount["mountPath"].lstrip("/")
        local.mkdir(parents=True, exist_ok=True)
        for file, content in data.items():
            (local / file).write_text(content)
        mapping[mount["mountPath"]] = local
    return mapping


def localize(arg: str, mapping: dict[str, Path]) -> str:
    for container_path, local in mapping.items():
        if arg == container_path or arg.startswith(container_path + "/"):
            return str(local) + arg[len(container_path) :]
    return arg


def server_binary() -> Path:
    path = Path(os.environ.get("RECSERVE_BIN", ROOT / "target" / "debug" / "recserve"))
    if not path.is_file():
        pytest.fail(f"no recserve binary at {path}: run scripts/check-helm.sh (it builds one), or set RECSERVE_BIN")
    return path


def dockerfile_env(name: str, dockerfile: str = "Dockerfile") -> str:
    """The value of `ENV name=...` in a Dockerfile: what the image provides the server."""
    text = (ROOT / dockerfile).read_text()
    match = re.search(rf"^ENV {name}=(\S+)$", text, re.MULTILINE)
    assert match, f"{dockerfile} sets no ENV {name}"
    return match.group(1)


def tool(name: str) -> str:
    """A command-line tool from .venv-helm (or PATH)."""
    here = Path(sys.prefix) / "bin" / name
    found = str(here) if here.is_file() else shutil.which(name)
    if not found:
        pytest.fail(f"{name} not found: run scripts/check-helm.sh, which installs helm/requirements.txt")
    return found
