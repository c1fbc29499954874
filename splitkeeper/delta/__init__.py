"""The Delta state of a pipeline and its exactly-once sink, on delta-rs (``deltalake``).

delta-rs is the only writer of these tables, through its public API; Spark only reads
them. One concern per module:

- :mod:`~splitkeeper.delta.schemas`: the one definition of every table (pyarrow schemas,
  partitioning, statistics, migration; ``state/<table>.ddl`` documents them);
- :mod:`~splitkeeper.delta.storage`: locations (``s3a://`` is ``s3://``), object-store options;
- :mod:`~splitkeeper.delta.tables`: create-if-absent, layout check, migration, reads,
  damaged-log and refused-write errors;
- :mod:`~splitkeeper.delta.fence`: the one first-writer-wins commit (Delta app transactions);
- :mod:`~splitkeeper.delta.lease`: who drives a pipeline now;
- :mod:`~splitkeeper.delta.control`: operator requests (stop) to a running pipeline;
- :mod:`~splitkeeper.delta.checkpoints`: :class:`DeltaStateStore`, the ``StateStore`` port;
- :mod:`~splitkeeper.delta.history`: the only reader of checkpoint history (the attempt/base
  rule of a checkpoint's enumerator rows, timeline, audit trail), for restore, status, the
  report and the checks;
- :mod:`~splitkeeper.delta.sink`: :class:`~splitkeeper.delta.sink.DeltaSink`, the ``EpochSink``
  port (fenced epoch commits of staged files), and ``read_sink``, the one reader of its rows;
- :mod:`~splitkeeper.delta.retention`: retention, compaction, vacuum;
- :mod:`~splitkeeper.delta.repair`: ``recover --repair`` of lost enumerator and audit rows;
- :mod:`~splitkeeper.delta.serde`: lossless row conversions of the core types.

Nothing here imports pyspark (but :func:`~splitkeeper.delta.sink.sink_frame`, which is handed a
session).
"""
