"""``python -m splitkeeper.cluster up|status|down``: the command behind ``scripts/cluster.sh``."""

from splitkeeper.cluster.local import main

if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
