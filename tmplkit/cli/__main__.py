"""`python -m tmplkit.cli`: the same as the `tmplkit` command."""

import sys

from . import main

sys.exit(main())
