"""`hearth pull REPO [--revision R]`: the same command as `hearth download`,
under the name Ollama's users reach for. It is the download command itself
(a subclass that changes only the help), so the two never drift apart."""
from __future__ import annotations

from hub.management.commands.download import Command as Download


class Command(Download):
    help = "Same as `hearth download`: download a model repo from the Hugging Face Hub into the local cache."
