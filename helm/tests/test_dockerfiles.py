"""The Dockerfiles cannot be built here (no container engine): they are linted with hadolint, and what the chart
and the server rely on is checked against them (the ENTRYPOINT, where ONNX Runtime is, the pinned versions)."""

from __future__ import annotations

import re
import subprocess
import tomllib

import pytest
from conftest import ROOT, dockerfile_env, tool

DOCKERFILES = ["Dockerfile", "Dockerfile.gpu"]


def arg_default(dockerfile: str, name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", (ROOT / dockerfile).read_text(), re.MULTILINE)
    assert match, f"{dockerfile} has no ARG {name}=..."
    return match.group(1)


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_hadolint_is_clean(dockerfile: str) -> None:
    result = subprocess.run(
        [tool("hadolint"), "--no-color", "--failure-threshold", "info", dockerfile],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_image_matches_what_the_chart_and_tests_use(dockerfile: str) -> None:
    text = (ROOT / dockerfile).read_text()
    # The chart sets only args (serve --config ...): the image's entrypoint must be the server.
    assert re.search(r'^ENTRYPOINT \["recserve"\]$', text, re.MULTILINE)
    assert "/usr/local/bin/recserve" in text
    # The server finds ONNX Runtime through ORT_DYLIB_PATH, at the path the files are copied to.
    ort = dockerfile_env("ORT_DYLIB_PATH", dockerfile)
    assert ort == "/opt/onnxruntime/lib/libonnxruntime.so"
    assert "COPY --from=onnxruntime /out/ /opt/onnxruntime/lib/" in text and "/out/libonnxruntime.so" in text
    # The same toolchain and ONNX Runtime as the tests.
    toolchain = tomllib.loads((ROOT / "rust-toolchain.toml").read_text())["toolchain"]["channel"]
    assert arg_default(dockerfile, "RUST_VERSION") == toolchain
    requirements = (ROOT / "models" / "requirements.txt").read_text()
    assert f"onnxruntime=={arg_default(dockerfile, 'ONNXRUNTIME_VERSION')}" in requirements
    # The image runs as the user the chart's securityContext expects.
    assert re.search(r"^USER 65532:65532$", text, re.MULTILINE)


def test_gpu_image_has_the_cuda_build_and_provider() -> None:
    text = (ROOT / "Dockerfile.gpu").read_text()
    assert "--features cuda" in text
    assert '"onnxruntime-gpu==${ONNXRUNTIME_VERSION}"' in text
    assert "libonnxruntime_providers_cuda.so" in text and "libonnxruntime_providers_shared.so" in text
    assert re.search(r"^ARG CUDA_IMAGE=nvidia/cuda:13\.\S+-cudnn-runtime-", text, re.MULTILINE)
    features = tomllib.loads((ROOT / "Cargo.toml").read_text())["features"]
    assert "cuda" in features


def test_build_context_leaves_out_local_state() -> None:
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {"target", ".venv", ".venv-helm", ".git"} <= ignored
    # What the build needs stays in.
    assert not {"src", "Cargo.toml", "Cargo.lock", "loadtest", "benches"} & ignored
