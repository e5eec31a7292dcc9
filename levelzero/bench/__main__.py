"""`python -m levelzero.bench [--quick] [--only ITEM]`."""

import sys

from .cli import main

sys.exit(main())
