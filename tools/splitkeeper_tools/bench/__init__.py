"""Benchmarks behind ``splitkeeper-tools bench NAME``; :mod:`splitkeeper_tools.bench.command` lists them."""
