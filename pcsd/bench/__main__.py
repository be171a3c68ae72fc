"""``python -m pcsd.bench``."""

from pcsd.bench import console_main

console_main()
