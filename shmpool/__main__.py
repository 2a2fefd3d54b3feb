"""``python -m shmpool``: the same as the ``shmpool`` command."""

import sys

from .cli import main

sys.exit(main())
