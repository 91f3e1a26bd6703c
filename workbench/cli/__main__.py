"""`python -m workbench.cli ...` (what torchrun runs for DDP training)."""

import sys

from . import main

sys.exit(main())
