"""``python -m pcsd.diagnostics``."""

import sys

from pcsd.diagnostics.cli import main

sys.exit(main())
