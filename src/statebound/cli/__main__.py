"""``python -m statebound.cli``: the same as the ``statebound`` command."""

import sys

from . import main

sys.exit(main())
