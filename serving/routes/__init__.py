"""The `/v1` client-protocol routes and the server's operational routes.

One module per protocol (`openai.py`: chat and text completions;
`anthropic.py`: Messages; `responses.py`; `embeddings.py`), the model list
(`models.py`), LoRA mounts (`adapters.py`), `/stats`, `/metrics`, `/health`
and `/admin/cache/*` (`ops.py`), and the one generation pipeline they share
(`pipeline.py`: prepare, submit, stream or collect). Each view reads the
process's runtime from `request.runtime`; errors are raised and rendered in
the route's protocol by `errors.py`.
"""
