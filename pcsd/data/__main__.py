"""``python -m pcsd.data``."""

from pcsd.data.cli import console_main

console_main()
