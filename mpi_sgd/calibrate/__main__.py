"""``mpiexec -n 2 python -m mpi_sgd.calibrate --save FILE``: measure, and the root saves."""

import sys

from .run import main

sys.exit(main())
