"""The former home of the Spark side, kept for one name only: ``splitkeeper.runtime.transforms``.

Pipeline files written before the re-cut name ``splitkeeper.runtime.transforms:identity`` or
``:enrich_json``; they keep loading. Everything else moved: the engine to
:mod:`splitkeeper.spark`, the Delta state and sink to :mod:`splitkeeper.delta`, the config to
:mod:`splitkeeper.config`, the pipeline to :mod:`splitkeeper.app` (``docs/architecture.md``).
"""
