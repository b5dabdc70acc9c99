"""Memory synthesis: chat sessions distilled into vault articles (no Django
in this package; `memory.synthesize` is the Django side)."""
