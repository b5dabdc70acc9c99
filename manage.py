#!/usr/bin/env python
"""Django's command-line utility; `hearth` is the same with the fast BLAS preloaded."""
import sys

if __name__ == "__main__":
    from config.cli import main

    sys.exit(main(sys.argv[1:], prog="manage.py"))
