"""`python -m tmplkit`: the same as the `tmplkit` command."""

import sys

from .cli import main

sys.exit(main())
