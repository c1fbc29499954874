"""The engine side of splitkeeper: Spark sessions and jars, the region runner (one Spark job per
epoch) and the region task, the Spark transform and injected faults.

The sources and the sink are not here: each kind is its own package (``splitkeeper.sources.<kind>``,
``splitkeeper.sinks.<kind>``). Submodules import Spark only when used; importing this package is
free.
"""
