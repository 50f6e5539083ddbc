"""`python -m e2e.kindcluster prepare`: kind's tools, node image and images, built ahead of a cluster."""

import sys

from e2e.kindcluster.engine import main

sys.exit(main())
