"""``python -m autosched``: the command line (see autosched.cli)."""

import sys

from autosched.cli import main

sys.exit(main())
