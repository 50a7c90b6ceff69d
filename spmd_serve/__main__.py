"""`python -m spmd_serve` = the `spmd_serve` console script."""

import sys

from spmd_serve.cli import main

sys.exit(main())
