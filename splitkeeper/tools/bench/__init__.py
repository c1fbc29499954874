"""Benchmarks behind ``splitkeeper bench NAME``; :mod:`splitkeeper.tools.bench.command` lists them."""
