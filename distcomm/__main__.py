"""``python -m distcomm``: the same as the ``distcomm`` command."""

import sys

from distcomm.cli import main

sys.exit(main())
