"""``python -m semif_adapter.demo_models``: kept for the documented command; see ``semif_adapter.model``."""

from __future__ import annotations

import sys

from semif_adapter.model.demo_models import main

if __name__ == "__main__":
    sys.exit(main())
