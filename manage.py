#!/usr/bin/env python
"""Django's command-line utility over every command, Hearth's included;
`hearth` is the command line for users (see hearth/cli.py)."""
import sys

if __name__ == "__main__":
    from hearth.cli import manage

    sys.exit(manage(sys.argv[1:], script=__file__))
