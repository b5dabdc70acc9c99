"""Tying a process's life to its parent's.

No Django here, and no imports of the project's apps."""
from __future__ import annotations

import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int) -> bool:
    """Ask Linux to send `signum` to this process when the thread that
    started it exits (PR_SET_PDEATHSIG); False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
