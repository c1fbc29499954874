"""splitkeeper: Flink-style split ownership, recovery and regional checkpoints for Spark ingestion."""

__version__ = "0.1.0"
