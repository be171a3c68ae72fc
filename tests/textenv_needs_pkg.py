"""An env module whose package is missing (tests/test_textenv.py: the config names it)."""

import no_such_package_abc  # noqa: F401


class Env:
    pass
