"""Serving models over HTTP, above the library: the runtime a server holds
(`runtime.py`), the `/v1` routes and the operations routes (`routes/`),
router mode's model processes (`router/`), resumable streams (`streams/`),
`/metrics` (`telemetry.py`), the flags of `hearth serve` (`serve_flags.py`)
and the demo models' builds (`demo/`)."""
