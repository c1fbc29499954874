"""Benchmarks behind ``splitkeeper bench NAME``; :mod:`splitkeeper.bench.command` lists them."""
