"""``python -m semif_ops`` = ``semif-ops`` (for places where the console script is not on PATH)."""

from semif_ops.cli import main

raise SystemExit(main())
