"""The FastAPI + uvicorn + onnxruntime peer: the ranking server a team writes when it has no serving system.

It answers `POST /v1/models/{model}/rank` with recserve's request and response bodies (docs/api.md), so the same
recload run drives both, and scores with `rankcore` (numpy gather, one onnxruntime session per model). Each
request is its own batch; the endpoint is a plain `def`, so FastAPI runs it on its thread pool, as its
documentation advises for blocking work. Run by loadtest/peers/run.sh as

    PEER_REPOSITORY=DIR PEER_MODELS=a,b uvicorn fastapi_server:app --app-dir loadtest/peers --workers 1
"""

from __future__ import annotations

import os
from pathlib import Path

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

from rankcore import RequestError, load_models

MODELS = load_models(
    Path(os.environ["PEER_REPOSITORY"]),
    [m for m in os.environ["PEER_MODELS"].split(",") if m],
    int(os.environ.get("PEER_INTRA_OP_THREADS", "1")),
)

app = FastAPI(title="DeepFM ranking (FastAPI peer)")


class UserSide(BaseModel):
    fields: dict[str, int] = {}
    dense: list[float] = []


class Candidate(BaseModel):
    id: int | None = None
    fields: dict[str, int] = {}


class RankRequest(BaseModel):
    user: UserSide = UserSide()
    candidates: list[Candidate]
    top_k: int | None = None


@app.get("/health/ready")
def ready() -> dict[str, str]:
    return {"status": "ready"}


@app.post("/v1/models/{model}/rank")
def rank(model: str, request: RankRequest) -> dict:
    served = MODELS.get(model)
    if served is None:
        raise HTTPException(status_code=404, detail=f"model {model!r} is not served")
    try:
        ids, dense = served.decode(
            request.user.fields, request.user.dense, [(c.id, c.fields) for c in request.candidates]
        )
    except RequestError as e:
        raise HTTPException(status_code=400, detail=str(e)) from e
    scores = served.score(ids, dense).tolist()
    order = range(len(scores))
    if request.top_k is not None:
        order = sorted(order, key=lambda i: (-scores[i], i))[: request.top_k]
    return {
        "model": model,
        "version": served.version,
        "scores": [{"index": i, "id": request.candidates[i].id, "score": scores[i]} for i in order],
    }
