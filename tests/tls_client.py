"""The real tritonclient against a recserve serving TLS with client certificates and inference tokens, for the
end-to-end test `tests/tls.rs`:

    python tests/tls_client.py --http HOST:PORT --grpc HOST:PORT --ca CA.pem --cert CLIENT.pem --key CLIENT.key \
        --token TOKEN --model MODEL

Over HTTPS (`ssl=True`, the CA and the client's certificate in `ssl_options`) and gRPC with TLS (`ssl=True`,
`root_certificates`, `private_key`, `certificate_chain`): liveness and readiness answer without a token; model
metadata and readiness need it (403 / PERMISSION_DENIED with a wrong one, 401 / UNAUTHENTICATED without);
statistics answer with it, and so does an inference of one row (every input element 1, from the metadata). Exits non-zero on the first difference; nothing is skipped (a missing tritonclient is an
ImportError).
"""

from __future__ import annotations

import argparse

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def refused(call, expected: str) -> None:
    """`call()` must raise with `expected` in its status."""
    try:
        call()
    except InferenceServerException as e:
        status = str(e.status())
        assert expected in status, f"expected {expected}, got {status}: {e}"
        return
    raise AssertionError(f"expected {expected}, the call succeeded")


DTYPES = {"INT64": np.int64, "INT32": np.int32, "FP32": np.float32}


def one_row(module, inputs: list[tuple[str, str, list[int]]]):
    """Inputs of one row, every element 1 (a valid id of any table, and a finite dense value)."""
    tensors = []
    for name, datatype, shape in inputs:
        shape = [1 if d == -1 else d for d in shape]
        tensor = module.InferInput(name, shape, datatype)
        tensor.set_data_from_numpy(np.ones(shape, dtype=DTYPES[datatype]))
        tensors.append(tensor)
    return tensors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("--http", "--grpc", "--ca", "--cert", "--key", "--token", "--model"):
        parser.add_argument(flag, required=True)
    args = parser.parse_args()
    good = {"authorization": f"Bearer {args.token}"}
    wrong = {"authorization": "Bearer not-the-token"}

    http = httpclient.InferenceServerClient(
        args.http,
        ssl=True,
        ssl_options={"ca_certs": args.ca, "certfile": args.cert, "keyfile": args.key},
    )
    assert http.is_server_live() and http.is_server_ready()
    metadata = http.get_model_metadata(args.model, headers=good)
    assert metadata["name"] == args.model, metadata
    assert http.is_model_ready(args.model, headers=good)
    assert http.get_inference_statistics(args.model, headers=good)["model_stats"]
    inputs = [(i["name"], i["datatype"], [int(d) for d in i["shape"]]) for i in metadata["inputs"]]
    # A copy: the HTTP client adds its binary-data header to the dict it is given.
    result = http.infer(args.model, one_row(httpclient, inputs), headers=dict(good))
    output = metadata["outputs"][0]["name"]
    assert result.as_numpy(output).shape[0] == 1, result.get_response()
    refused(lambda: http.get_model_metadata(args.model, headers=wrong), "403")
    refused(lambda: http.get_model_metadata(args.model), "401")
    http.close()

    grpc = grpcclient.InferenceServerClient(
        args.grpc,
        ssl=True,
        root_certificates=args.ca,
        private_key=args.key,
        certificate_chain=args.cert,
    )
    assert grpc.is_server_live() and grpc.is_server_ready()
    metadata = grpc.get_model_metadata(args.model, headers=good)
    assert metadata.name == args.model, metadata
    assert grpc.is_model_ready(args.model, headers=good)
    assert grpc.get_inference_statistics(args.model, headers=good).model_stats
    result = grpc.infer(args.model, one_row(grpcclient, inputs), headers=good)
    assert result.as_numpy(output).shape[0] == 1, result.get_response()
    refused(lambda: grpc.get_model_metadata(args.model, headers=wrong), "PERMISSION_DENIED")
    refused(lambda: grpc.get_model_metadata(args.model), "UNAUTHENTICATED")
    grpc.close()
    print("tritonclient over TLS: all calls as expected")


if __name__ == "__main__":
    main()
