"""``python -m gpuscope``."""

import sys

from gpuscope.cli import main

if __name__ == "__main__":
    sys.exit(main())
