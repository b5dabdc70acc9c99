"""`POST /v1/embeddings`, when the served model is an embedding model.
The forward runs on the engine thread, between decode steps."""
from __future__ import annotations

import asyncio

from django.http import HttpRequest, JsonResponse
from ninja import Router

from inference.engine.embed import embed
from inference.protocols import embeddings, params
from inference.protocols.errors import RequestError
from inference.runtime import runtime

router = Router(tags=["embeddings"])


@router.post("/embeddings")
async def create(request: HttpRequest):
    engine = runtime.require_engine()
    model = engine.loaded
    body = params.parse_json_body(request.body)
    if not runtime.embeddings_enabled:
        raise RequestError(f"{model.model_id} is not an embedding model; serve one (its name or config says "
                           "embedding) or start `hearth serve --embeddings` to embed with this model", "model")
    items = embeddings.texts(body)
    fmt = embeddings.encoding(body)
    tokens = [model.tokenizer.encode(text) for text in items]
    window = model.context_window
    for i, t in enumerate(tokens):
        if window and len(t) > window:
            raise RequestError(f"input[{i}] has {len(t)} tokens, over the model's context of {window}", "input")
    vectors = await asyncio.to_thread(engine.call, lambda: model.adapters.base_only(lambda: embed(model.model, tokens)),
                                      300.0)
    return JsonResponse(embeddings.reply(vectors, model.model_id, sum(len(t) for t in tokens), fmt))
