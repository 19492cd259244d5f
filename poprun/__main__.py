"""``python -m poprun``."""

import sys

from poprun.cli import main

if __name__ == "__main__":
    sys.exit(main())
