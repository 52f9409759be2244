"""``python -m writescope ...`` is the ``writescope`` command (for environments whose script
folder is not on PATH)."""
from .cli import main

raise SystemExit(main())
