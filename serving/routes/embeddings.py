"""`POST /v1/embeddings`, when the served model is an embedding model.
At most `embeddings.MAX_TAKEN` requests are served at once (429 past it);
texts are tokenized as prompts are (`prompt_work.run`: over 64K characters
on the large prompts' thread, one at a time); the forward runs on the
engine thread in turns of at most the engine's prefill chunk of tokens
(`embed_turns`), between decode steps."""
from __future__ import annotations

import asyncio

from django.http import HttpRequest, JsonResponse

from core.openapi import documented
from core.surfaces import OPENAI
from inference.engine.embed import embed_turns
from inference.protocols import embeddings, prompt_work, unhonoured
from inference.protocols.errors import RequestError
from serving.routes import pipeline
from serving.routes.bodies import EmbeddingsRequest

router = OPENAI.router(tags=["embeddings"])


@router.post("/embeddings", openapi_extra=documented(EmbeddingsRequest))
async def create(request: HttpRequest):
    runtime = request.runtime
    body = await pipeline.read_body(request)
    engine = runtime.require_engine(body.get("model"))
    model = engine.loaded
    if not runtime.embeddings_enabled:
        raise RequestError(f"{model.model_id} is not an embedding model; serve one (its name or config says "
                           "embedding) or start `hearth serve --embeddings` to embed with this model", "model")
    items = embeddings.inputs(body, runtime.options.limits, model.vocab_size)
    fmt = embeddings.encoding(body)
    with embeddings.taken():
        chars = sum(len(t) for t in items if isinstance(t, str))
        tokens = await prompt_work.run(chars, embeddings.tokenize, model.tokenizer, items)
        vectors = await _embed(engine, model, tokens)
    unread = unhonoured.ignored(body, EmbeddingsRequest.model_fields, unhonoured.EMBEDDINGS)
    return JsonResponse(embeddings.reply(vectors, model.model_id, sum(len(t) for t in tokens), fmt),
                        headers={pipeline.IGNORED_HEADER: unhonoured.header_value(unread)} if unread else None)


async def _embed(engine, model, tokens: list[list[int]]) -> list:
    window = model.context_window
    for i, t in enumerate(tokens):
        if window and len(t) > window:
            raise RequestError(f"input[{i}] has {len(t)} tokens, over the model's context of {window}", "input")
    vectors: list = []
    # One turn of the engine thread per call, as long as a prefill chunk, so decode steps of running
    # generations go on in between (and a client that leaves stops the rest).
    turns = embed_turns(model.model, tokens, engine.config.prefill_chunk)
    done = object()
    while (part := await asyncio.to_thread(
            engine.call, lambda: model.adapters.base_only(lambda: next(turns, done)), 300.0)) is not done:
        vectors += part
    return vectors
