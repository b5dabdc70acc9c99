"""The server process and the command line, above every app: `hearth serve`
in either mode (`process.py`, `router_mode.py`, the demo trained beside the
router in `demo_training.py`), the ASGI application and its middleware, who
may use the server (`access.py`, `access_settings.py`, `signin.py`), the
dashboard's pages and static files, and the `hearth` command (`cli.py`).
Django's project settings and URLs are `config/`."""
