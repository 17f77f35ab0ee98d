"""``python -m openonce_core.cli``: the ``openonce`` command."""

import sys

from . import main

if __name__ == "__main__":  # not when a tool walks the package's modules
    sys.exit(main())
