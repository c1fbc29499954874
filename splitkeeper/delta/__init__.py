"""The Delta state of a pipeline and the sink's commit protocol, on delta-rs (``deltalake``).

delta-rs is the only writer of these tables, through its public API; Spark only reads
them. One concern per module:

- :mod:`~splitkeeper.delta.storage`: locations (``s3a://`` is ``s3://``), object-store options;
- :mod:`~splitkeeper.delta.tables`: the one schema definition (``state/<table>.ddl``),
  create-if-absent, layout check, migration, damaged-log errors;
- :mod:`~splitkeeper.delta.fence`: the one first-writer-wins commit (Delta app transactions);
- :mod:`~splitkeeper.delta.lease`: who drives a pipeline now;
- :mod:`~splitkeeper.delta.checkpoints`: :class:`DeltaStateStore`, the ``StateStore`` port;
- :mod:`~splitkeeper.delta.history`: the only read API for timeline and audit trail;
- :mod:`~splitkeeper.delta.retention`: retention, compaction, vacuum;
- :mod:`~splitkeeper.delta.serde`: lossless row conversions of the core types.

The sink itself (:class:`splitkeeper.delta.sink.DeltaSink`) commits through the same
fence and tables. Nothing here imports pyspark.
"""
