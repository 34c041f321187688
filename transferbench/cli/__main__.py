"""`python -m transferbench.cli`: the `transferbench` command."""

import sys

from . import main

sys.exit(main())
