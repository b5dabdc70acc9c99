"""Hearth's version, as the installed distribution states it."""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("hearth")
except PackageNotFoundError:  # running from a checkout that was never installed
    __version__ = "0.0.0"
