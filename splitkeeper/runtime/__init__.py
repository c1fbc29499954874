"""The engine side of splitkeeper: Spark sessions, local jars, the local Kafka broker.

Submodules import Spark, Delta or Kafka clients only when used; importing this
package is free.
"""
