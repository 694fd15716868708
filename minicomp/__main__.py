"""`python -m minicomp ...`: the same command as `minicomp ...` (see minicomp/cli.py)."""

import sys

from minicomp.cli import main

if __name__ == "__main__":
    sys.exit(main())
