"""Drives a running recserve with the real `tritonclient` package, for the end-to-end tests `tests/kserve.rs` and
`tests/demo_models.rs`.

    python tests/kserve_client.py --http HOST:PORT --grpc HOST:PORT --jobs JOBS.json --out RESULTS.json
    python tests/kserve_client.py --http HOST:PORT --grpc HOST:PORT --generic MODEL,MODEL --out RESULTS.json

`--generic` calls each model as generic Open Inference Protocol tooling does, knowing nothing but what the model
metadata says: over each transport (HTTP with JSON tensors, HTTP with binary tensors, gRPC) it reads the
metadata through that transport's client and builds, from the inputs' names, datatypes and shapes alone (-1 is a
batch of `GENERIC_ROWS`), every element of row `r` set to `r + 1` (valid in any table of more than
`GENERIC_ROWS` rows, and as any count), three requests:

- "required": the inputs the metadata's `properties` do not list in `optional_inputs`;
- "all": every input; an optional one holds its `<name>.default` property when the metadata has one, else the
  fill (tritonclient's gRPC client, built on Triton's proto, does not show `properties`);
- "all_int32": as "all", with optional integer inputs sent as `INT32`.

After its calls, each model's statistics (`get_inference_statistics`) and configuration (`get_model_config`) are
read over HTTP and gRPC (`as_json`: protobuf's JSON, where 64-bit integers are strings and zeros are left out),
and both are asked of a version that is not served ("unknown": the status and message each client raised).

RESULTS.json: {"generic": {MODEL: {"metadata": {TRANSPORT: metadata}, "calls": [{"transport", "variant",
"inputs": {name: {"datatype", "shape", "values"}}, "outputs": {name: {"dtype", "shape", "values"}}}],
"statistics": {"http", "grpc"}, "config": {"http", "grpc"}, "unknown": [{"what", "protocol", "status",
"message"}]}}}.

JOBS.json: {"model": NAME, "jobs": [{"model", "categorical": [[int]], "dense": [[float]] | null, "output"}]}.
RESULTS.json records what the clients saw; the Rust test compares it with `/v1` and with the contract:

- "server": liveness, readiness, server and model metadata over HTTP and gRPC;
- "jobs": for every job, the output tensor over HTTP with binary data (tritonclient's default), over HTTP with JSON
  tensors (binary_data=False both ways), and over gRPC (raw_input_contents / raw_output_contents);
- "errors": malformed requests sent through tritonclient, with the status and message it raised;
- "after_errors": a valid job run again over both protocols once the errors were sent.

Nothing here is skipped: a missing tritonclient (or numpy) is an ImportError and a non-zero exit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def http_inputs(job: dict[str, Any], binary: bool) -> list[httpclient.InferInput]:
    categorical = np.array(job["categorical"], dtype=np.int64)
    inputs = [httpclient.InferInput("categorical", list(categorical.shape), "INT64")]
    inputs[0].set_data_from_numpy(categorical, binary_data=binary)
    if job["dense"] is not None:
        dense = np.array(job["dense"], dtype=np.float32)
        inputs.append(httpclient.InferInput("dense", list(dense.shape), "FP32"))
        inputs[1].set_data_from_numpy(dense, binary_data=binary)
    return inputs


def grpc_inputs(job: dict[str, Any]) -> list[grpcclient.InferInput]:
    categorical = np.array(job["categorical"], dtype=np.int64)
    inputs = [grpcclient.InferInput("categorical", list(categorical.shape), "INT64")]
    inputs[0].set_data_from_numpy(categorical)
    if job["dense"] is not None:
        dense = np.array(job["dense"], dtype=np.float32)
        inputs.append(grpcclient.InferInput("dense", list(dense.shape), "FP32"))
        inputs[1].set_data_from_numpy(dense)
    return inputs


def tensor(result: Any, name: str) -> dict[str, Any]:
    array = result.as_numpy(name)
    if array is None:
        raise SystemExit(f"the response has no output {name!r}")
    return {"dtype": str(array.dtype), "shape": list(array.shape), "values": array.reshape(-1).tolist()}


def run_job(http: Any, grpc: Any, job: dict[str, Any]) -> dict[str, Any]:
    model, output = job["model"], job["output"]
    binary = http.infer(model, http_inputs(job, binary=True))
    as_json = http.infer(
        model,
        http_inputs(job, binary=False),
        outputs=[httpclient.InferRequestedOutput(output, binary_data=False)],
    )
    over_grpc = grpc.infer(model, grpc_inputs(job), client_timeout=60.0)
    return {
        "http_binary": tensor(binary, output),
        "http_json": tensor(as_json, output),
        "grpc": tensor(over_grpc, output),
    }


def expect_error(what: str, protocol: str, call: Callable[[], Any]) -> dict[str, Any]:
    try:
        call()
    except InferenceServerException as e:
        return {"what": what, "protocol": protocol, "status": e.status(), "message": e.message()}
    return {"what": what, "protocol": protocol, "status": None, "message": "no error was raised"}


def errors(http: Any, grpc: Any, job: dict[str, Any]) -> list[dict[str, Any]]:
    model = job["model"]
    out: list[dict[str, Any]] = []
    categorical = np.array(job["categorical"], dtype=np.int64)

    def wrong_datatype_http() -> Any:
        inputs = http_inputs(job, binary=True)
        inputs[0] = httpclient.InferInput("categorical", list(categorical.shape), "INT32")
        inputs[0].set_data_from_numpy(categorical.astype(np.int32))
        return http.infer(model, inputs)

    def wrong_datatype_grpc() -> Any:
        inputs = grpc_inputs(job)
        inputs[0] = grpcclient.InferInput("categorical", list(categorical.shape), "FP32")
        inputs[0].set_data_from_numpy(categorical.astype(np.float32))
        return grpc.infer(model, inputs)

    def short_raw_grpc() -> Any:
        inputs = grpc_inputs(job)
        # The data stays that of the real shape; the declared shape has one more row.
        inputs[0].set_shape([categorical.shape[0] + 1, categorical.shape[1]])
        return grpc.infer(model, inputs)

    def short_binary_http() -> Any:
        inputs = http_inputs(job, binary=True)
        inputs[0].set_shape([categorical.shape[0] + 1, categorical.shape[1]])
        return http.infer(model, inputs)

    def missing_input_grpc() -> Any:
        return grpc.infer(model, grpc_inputs(job)[1:])

    def unknown_output_http() -> Any:
        return http.infer(model, http_inputs(job, binary=True), outputs=[httpclient.InferRequestedOutput("score")])

    def unknown_output_grpc() -> Any:
        return grpc.infer(model, grpc_inputs(job), outputs=[grpcclient.InferRequestedOutput("score")])

    out.append(expect_error("wrong datatype", "http", wrong_datatype_http))
    out.append(expect_error("wrong datatype", "grpc", wrong_datatype_grpc))
    out.append(expect_error("shape disagrees with the data", "http", short_binary_http))
    out.append(expect_error("shape disagrees with the data", "grpc", short_raw_grpc))
    out.append(expect_error("missing input", "grpc", missing_input_grpc))
    out.append(expect_error("unknown output", "http", unknown_output_http))
    out.append(expect_error("unknown output", "grpc", unknown_output_grpc))
    out.append(expect_error("unknown model", "grpc", lambda: grpc.get_model_metadata("no-such-model")))
    return out


def server_facts(http: Any, grpc: Any, model: str) -> dict[str, Any]:
    grpc_metadata = grpc.get_model_metadata(model, as_json=True)
    return {
        "http": {
            "live": http.is_server_live(),
            "ready": http.is_server_ready(),
            "model_ready": http.is_model_ready(model),
            "server_metadata": http.get_server_metadata(),
            "model_metadata": http.get_model_metadata(model),
        },
        "grpc": {
            "live": grpc.is_server_live(),
            "ready": grpc.is_server_ready(),
            "model_ready": grpc.is_model_ready(model),
            "server_metadata": grpc.get_server_metadata(as_json=True),
            "model_metadata": grpc_metadata,
        },
    }


GENERIC_ROWS = 2
TRANSPORTS = ("http_json", "http_binary", "grpc")
NUMPY = {"INT64": np.int64, "INT32": np.int32, "FP32": np.float32}


def generic_inputs(metadata: dict[str, Any], variant: str) -> list[tuple[str, str, np.ndarray]]:
    """(name, datatype, values) of the inputs of one generic request, from the metadata alone."""
    properties = metadata.get("properties", {})
    optional = {name for name in properties.get("optional_inputs", "").split(",") if name}
    out = []
    for tensor in metadata["inputs"]:
        name, datatype = tensor["name"], tensor["datatype"]
        if variant == "required" and name in optional:
            continue
        shape = [GENERIC_ROWS if int(d) == -1 else int(d) for d in tensor["shape"]]
        rows = np.arange(1, shape[0] + 1).reshape([shape[0]] + [1] * (len(shape) - 1)) if shape else np.array(1)
        values = np.broadcast_to(rows, shape)
        if name in optional and f"{name}.default" in properties:
            values = np.full(shape, int(properties[f"{name}.default"]))
        if variant == "all_int32" and name in optional and datatype == "INT64":
            datatype = "INT32"
        out.append((name, datatype, np.ascontiguousarray(values, dtype=NUMPY[datatype])))
    return out


def generic_call(http: Any, grpc: Any, model: str, transport: str, metadata: dict[str, Any], variant: str) -> dict:
    inputs = generic_inputs(metadata, variant)
    outputs = [t["name"] for t in metadata["outputs"]]
    if transport == "grpc":
        tensors = [grpcclient.InferInput(name, list(values.shape), datatype) for name, datatype, values in inputs]
        for t, (_, _, values) in zip(tensors, inputs, strict=True):
            t.set_data_from_numpy(values)
        result = grpc.infer(model, tensors, client_timeout=60.0)
    else:
        binary = transport == "http_binary"
        tensors = [httpclient.InferInput(name, list(values.shape), datatype) for name, datatype, values in inputs]
        for t, (_, _, values) in zip(tensors, inputs, strict=True):
            t.set_data_from_numpy(values, binary_data=binary)
        requested = [httpclient.InferRequestedOutput(name, binary_data=binary) for name in outputs]
        result = http.infer(model, tensors, outputs=requested)
    return {
        "transport": transport,
        "variant": variant,
        "inputs": {
            name: {"datatype": datatype, "shape": list(values.shape), "values": values.reshape(-1).tolist()}
            for name, datatype, values in inputs
        },
        "outputs": {name: tensor(result, name) for name in outputs},
    }


def generic(http: Any, grpc: Any, models: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for model in models:
        metadata = {
            "http": http.get_model_metadata(model),
            "grpc": grpc.get_model_metadata(model, as_json=True),
        }
        calls = []
        for transport in TRANSPORTS:
            seen = metadata["grpc" if transport == "grpc" else "http"]
            for variant in ("required", "all", "all_int32"):
                calls.append(generic_call(http, grpc, model, transport, seen, variant))
        out[model] = {"metadata": metadata, "calls": calls, **extensions(http, grpc, model)}
    return out


def settled_statistics(http: Any, grpc: Any, model: str) -> dict[str, Any]:
    """`model`'s statistics over both transports once the HTTP answer stops changing (two reads 50 ms apart, then
    gRPC, then HTTP once more): a batch is added when its executor has finished it, which may be just after its
    requests were answered, so a read right after the last answer can miss it (as in Triton)."""
    for _ in range(100):
        first = http.get_inference_statistics(model)
        time.sleep(0.05)
        if http.get_inference_statistics(model) != first:
            continue
        over_grpc = grpc.get_inference_statistics(model, as_json=True)
        if http.get_inference_statistics(model) == first:
            return {"http": first, "grpc": over_grpc}
    raise SystemExit(f"{model}: the statistics did not settle in 5 s")


def extensions(http: Any, grpc: Any, model: str) -> dict[str, Any]:
    """The statistics and model configuration extensions of `model` over both transports, after its calls."""
    return {
        "statistics": settled_statistics(http, grpc, model),
        "config": {
            "http": http.get_model_config(model),
            "grpc": grpc.get_model_config(model, as_json=True),
        },
        "unknown": [
            expect_error("statistics of a version not served", "http",
                         lambda: http.get_inference_statistics(model, model_version="999")),
            expect_error("statistics of a version not served", "grpc",
                         lambda: grpc.get_inference_statistics(model, model_version="999")),
            expect_error("configuration of a version not served", "http",
                         lambda: http.get_model_config(model, model_version="999")),
            expect_error("configuration of a version not served", "grpc",
                         lambda: grpc.get_model_config(model, model_version="999")),
        ],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", required=True, help="HOST:PORT of the HTTP API")
    parser.add_argument("--grpc", required=True, help="HOST:PORT of the gRPC API")
    parser.add_argument("--jobs")
    parser.add_argument("--generic", help="comma-separated models to call from their metadata alone")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if (args.jobs is None) == (args.generic is None):
        parser.error("give --jobs or --generic")
    if args.generic is not None:
        http = httpclient.InferenceServerClient(args.http, network_timeout=120.0)
        grpc = grpcclient.InferenceServerClient(args.grpc)
        with open(args.out, "w") as f:
            json.dump({"generic": generic(http, grpc, args.generic.split(","))}, f)
        return 0

    with open(args.jobs) as f:
        spec = json.load(f)
    http = httpclient.InferenceServerClient(args.http, network_timeout=120.0)
    grpc = grpcclient.InferenceServerClient(args.grpc)
    results: dict[str, Any] = {"server": server_facts(http, grpc, spec["model"])}
    results["jobs"] = [run_job(http, grpc, job) for job in spec["jobs"]]
    results["errors"] = errors(http, grpc, spec["jobs"][0])
    results["after_errors"] = run_job(http, grpc, spec["jobs"][0])
    with open(args.out, "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
