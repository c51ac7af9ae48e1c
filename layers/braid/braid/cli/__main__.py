"""`python -m braid.cli`."""

import sys

from braid.cli.main import main

sys.exit(main())
