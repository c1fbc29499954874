"""``python -m splitkeeper_tools.cluster up|status|down``: the command behind ``scripts/cluster.sh``."""

from splitkeeper_tools.cluster.local import main

if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
