"""Tools around the product, not part of its data path: the benchmarks (``bench``), the fault
runs (``chaos``), the local cluster (``cluster``), the demo, the Kafka broker launcher and test
bed, and ``doctor``. They may import any part of the product; no part of the product imports
them (an import-linter contract in pyproject.toml). The CLI registers their commands.
"""
