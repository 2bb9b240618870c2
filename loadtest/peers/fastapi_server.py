"""The FastAPI + uvicorn + onnxruntime peer: the ranking server a team that cares writes without a serving system.

It answers `POST /v1/models/{model}/rank` with recserve's request and response bodies (docs/api.md), so the same
recload run drives both: the columnar body (the user once, the candidates as an id matrix: what recload sends with
`--body columnar`) and the row form. The handler is `async def`: it reads the raw body, parses it with orjson
(no pydantic model, no dict per candidate), gathers with `rankcore` (one numpy `take` per table over the id
matrix, the user row once) and runs onnxruntime, then answers with orjson. Each request is its own batch.

Inference runs in the event loop, not on FastAPI's thread pool: with one worker per core there is nothing for a
second thread to overlap with, and the hop costs a hand-off and a wake-up per request; more cores get more
`--workers`. Both variants gave the same scores as recserve (`recload check`, 2026-12-04); the event-loop one is
what the strongest single-worker server does.
Run by scripts/bench-peers-tail.sh as

    PEER_REPOSITORY=DIR PEER_MODELS=a,b uvicorn fastapi_server:app --app-dir loadtest/peers --workers 1 \\
        --loop uvloop --http httptools --no-access-log
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from rankcore import RequestError, load_models

MODELS = load_models(
    Path(os.environ["PEER_REPOSITORY"]),
    [m for m in os.environ["PEER_MODELS"].split(",") if m],
    int(os.environ.get("PEER_INTRA_OP_THREADS", "1")),
)

app = FastAPI(title="DeepFM ranking (FastAPI peer)")


def _error(status: int, message: str) -> Response:
    return Response(orjson.dumps({"error": message}), status_code=status, media_type="application/json")


@app.get("/health/ready")
async def ready() -> Response:
    return Response(b'{"status":"ready"}', media_type="application/json")


@app.post("/v1/models/{model}/rank")
async def rank(model: str, request: Request) -> Response:
    served = MODELS.get(model)
    if served is None:
        return _error(404, f"model {model!r} is not served")
    try:
        body = orjson.loads(await request.body())
        decoded = served.decode_json(body)
        top_k = body.get("top_k")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
            raise RequestError("top_k: must be a positive integer")
    except orjson.JSONDecodeError as e:
        return _error(400, f"the body is not JSON: {e}")
    except RequestError as e:
        return _error(400, str(e))
    scores = served.score([decoded]).tolist()
    order = range(len(scores))
    if top_k is not None:
        order = sorted(order, key=lambda i: (-scores[i], i))[:top_k]
    ids = decoded.ids
    answer = [
        {"index": i, "id": ids[i], "score": scores[i]} if ids is not None else {"index": i, "score": scores[i]}
        for i in order
    ]
    return Response(
        orjson.dumps({"model": model, "version": served.version, "scores": answer}), media_type="application/json"
    )
