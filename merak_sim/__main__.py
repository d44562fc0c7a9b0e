"""``python -m merak_sim`` runs the merak-sim command line."""

import sys

from merak_sim.cli import main

sys.exit(main())
