"""The Triton peer: a Python-backend model that scores recserve's `/v1` rank JSON with `rankcore`.

The PyPI `nvidia-pytriton` wheel bundles tritonserver 2.51 with only the Python backend (no native ONNX Runtime
backend), so this is how that Triton serves the model: each request carries the rank JSON as one BYTES element
(input `REQUEST`, shape [1, 1]); Triton's dynamic batcher hands `execute` every request queued while the previous
batch ran, and their rows are gathered in numpy and scored in one onnxruntime run, then split back (output
`SCORES`, shape [1, candidates]). A request that fails validation gets its own error; the others are answered.

loadtest/peers/run.sh writes the Triton model directory: `config.pbtxt` (parameters `repository`, `model`,
`intra_op_threads`) and a `model.py` that puts the peer virtualenv and this directory on `sys.path` (the stub
ignores PYTHONPATH) and imports `TritonPythonModel` from here.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from rankcore import RankModel, RequestError


def _invalid(message: str):
    code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
    error = pb_utils.TritonError(message, code) if code is not None else pb_utils.TritonError(message)
    return pb_utils.InferenceResponse(output_tensors=[], error=error)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.model = RankModel(Path(params["repository"]), params["model"], int(params.get("intra_op_threads", "1")))

    def execute(self, requests):
        responses = [None] * len(requests)
        decoded = []
        for i, request in enumerate(requests):
            try:
                raw = pb_utils.get_input_tensor_by_name(request, "REQUEST").as_numpy().reshape(-1)[0]
                decoded.append((i, *self.model.decode_json(json.loads(raw))))
            except (RequestError, ValueError) as e:
                responses[i] = _invalid(str(e))
        if decoded:
            ids = np.concatenate([d[1] for d in decoded])
            dense = np.concatenate([d[2] for d in decoded])
            scores = self.model.score(ids, dense)
            start = 0
            for i, request_ids, _ in decoded:
                end = start + request_ids.shape[0]
                tensor = pb_utils.Tensor("SCORES", scores[start:end].reshape(1, -1).astype(np.float32))
                responses[i] = pb_utils.InferenceResponse(output_tensors=[tensor])
                start = end
        return responses
