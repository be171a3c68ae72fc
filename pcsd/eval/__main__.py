"""``python -m pcsd.eval``."""

import sys

from pcsd.eval.cli import main

sys.exit(main())
