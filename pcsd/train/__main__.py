"""``python -m pcsd.train``."""

import sys

from pcsd.train.cli import main

sys.exit(main())
