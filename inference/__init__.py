"""Serving: the engine, the protocol layer and the `/v1` routes."""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("hearth")
except PackageNotFoundError:  # running from a checkout that was never installed
    __version__ = "0.0.0"
