"""Drives recserve's model repository API with the real `tritonclient`, for the end-to-end test `tests/lifecycle.rs`.

    python tests/repository_client.py --http HOST:PORT --grpc HOST:PORT --token TOKEN --model NAME --out OUT.json

Over HTTP and over gRPC, with and without the admin token: `get_model_repository_index`, `unload_model` then
`load_model` of `--model`, and `is_model_ready` around them. OUT.json records what each call returned or the status
and message tritonclient raised; the Rust test checks it. A missing tritonclient is an ImportError, never a skip.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def outcome(call: Callable[[], Any]) -> dict[str, Any]:
    """What a call returned, or the status and message it raised."""
    try:
        return {"ok": True, "value": call()}
    except InferenceServerException as e:
        return {"ok": False, "status": str(e.status()), "message": e.message()}


def index_names(index: Any) -> list[dict[str, str]]:
    """The index as plain dicts, from either client's answer."""
    if isinstance(index, list):
        entries = index
    else:
        entries = [{"name": m.name, "version": m.version, "state": m.state, "reason": m.reason} for m in index.models]
    return [{k: str(e.get(k, "")) for k in ("name", "version", "state", "reason")} for e in entries]


def session(client: Any, model: str, headers: dict[str, str] | None) -> dict[str, Any]:
    """The repository calls one client makes, with `headers` (the token, or none)."""
    out: dict[str, Any] = {}
    out["index"] = outcome(lambda: index_names(client.get_model_repository_index(headers=headers)))
    out["unload"] = outcome(lambda: client.unload_model(model, headers=headers))
    out["ready_after_unload"] = outcome(lambda: client.is_model_ready(model))
    out["load"] = outcome(lambda: client.load_model(model, headers=headers))
    out["ready_after_load"] = outcome(lambda: client.is_model_ready(model))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--http", required=True)
    parser.add_argument("--grpc", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    http = httpclient.InferenceServerClient(args.http)
    grpc = grpcclient.InferenceServerClient(args.grpc)
    results = {
        "http_without_token": session(http, args.model, None),
        "grpc_without_token": session(grpc, args.model, None),
        "http": session(http, args.model, {"Authorization": f"Bearer {args.token}"}),
        "grpc": session(grpc, args.model, {"authorization": f"Bearer {args.token}"}),
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
