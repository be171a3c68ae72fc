"""``python -m pcsd.view RUN [RUN_B] [--out PATH]``: writes the run's page (docs/view.md)."""

import sys

from pcsd.view.cli import main

if __name__ == "__main__":
    sys.exit(main())
