"""``python -m ragkit.cli`` (also under ``accelerate launch -m ragkit.cli train ...``)."""

from __future__ import annotations

import sys

from ragkit.cli import main

if __name__ == "__main__":
    sys.exit(main())
