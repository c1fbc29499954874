"""``python -m splitkeeper``: the same console script as ``splitkeeper``."""

from splitkeeper.cli import main

raise SystemExit(main())
