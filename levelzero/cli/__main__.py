"""`python -m levelzero.cli`: the console script's entry."""

import sys

from levelzero.cli.main import main

sys.exit(main())
