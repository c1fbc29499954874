"""``python -m splitkeeper_tools``: the same as the ``splitkeeper-tools`` command."""

from splitkeeper_tools.cli import main

if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
