"""What the demo builds' resume tests share (test_demo_resume.py, test_demo_speech_resume.py)."""
from __future__ import annotations

import signal

import pytest


@pytest.fixture
def default_signals():
    """SIGINT and SIGTERM as a build's own process has them: a pytest-xdist
    worker ignores SIGINT, and the build leaves a signal it does not own alone."""
    before = {signum: signal.signal(signum, handler)
              for signum, handler in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL))}
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)
