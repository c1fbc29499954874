"""The engine side of splitkeeper: the pipeline on Spark (sessions, jars, region tasks, sources, the sink).

Submodules import Spark, Delta or Kafka clients only when used; importing this
package is free.
"""
