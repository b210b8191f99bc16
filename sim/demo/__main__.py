"""`python -m sim.demo`: the product end to end on the simulated cluster (see `sim.demo.run`)."""

from __future__ import annotations

import sys

from sim.demo.run import main

if __name__ == "__main__":
    sys.exit(main())
