# syntax=docker/dockerfile:1
# recserve for CPU nodes: the server built in release mode, on a slim Debian runtime with ONNX Runtime's shared
# library taken from the onnxruntime wheel on PyPI (the version the tests use, models/requirements.txt).
#
#   docker build -t REGISTRY/recserve:0.1.0 .
#   docker run -p 8000:8000 -v /path/to/repository:/models:ro REGISTRY/recserve:0.1.0
#
# The GPU image is Dockerfile.gpu. Neither is built in CI (no container engine on the development machines);
# scripts/check-helm.sh lints both with hadolint and checks them against the chart and the toolchain pins.

ARG RUST_VERSION=1.95.0
ARG ONNXRUNTIME_VERSION=1.31.1

FROM rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --package recserve --bin recserve \
    && install -D -m 0755 target/release/recserve /out/recserve

# Only the shared library is kept from the wheel; it needs nothing but libc and libstdc++.
FROM python:3.11-slim-bookworm AS onnxruntime
ARG ONNXRUNTIME_VERSION
RUN pip download --no-cache-dir --no-deps --only-binary=:all: --dest /wheel "onnxruntime==${ONNXRUNTIME_VERSION}" \
    && python -m zipfile -e /wheel/onnxruntime-*.whl /unpacked \
    && install -D -m 0644 "/unpacked/onnxruntime/capi/libonnxruntime.so.${ONNXRUNTIME_VERSION}" /out/libonnxruntime.so

FROM debian:bookworm-slim
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libstdc++6 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=onnxruntime /out/ /opt/onnxruntime/lib/
COPY --from=build /out/recserve /usr/local/bin/recserve
# The server loads ONNX Runtime from here (--ort-library overrides it).
ENV ORT_DYLIB_PATH=/opt/onnxruntime/lib/libonnxruntime.so
USER 65532:65532
EXPOSE 8000 8001
ENTRYPOINT ["recserve"]
CMD ["serve", "--repository", "/models"]
