import sys

from semif_adapter.cli import main

sys.exit(main())
