"""The lowest layer: helpers every app shares and that import none of them
(paths and limits, strict JSON, HTTP guards, processes, BLAS). Only `api.py`
uses Django, for the `/api` answer shape; the engine never imports it."""
