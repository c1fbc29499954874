"""Records: what a record's bytes are and what the sink and the dead-letter table get.

- :mod:`splitkeeper.records.spec`: the decode spec (``decode`` section, engine-free), the one
  definition of the sink's data columns, derived from the config.
- :mod:`splitkeeper.records.ddl`: Spark DDL strings (``"id BIGINT, name STRING"``) parsed
  without Spark, and their Arrow types.
- :mod:`splitkeeper.records.decode`: the decoders (raw, text, json, csv, avro), columnar over a
  whole range with Arrow; a record that does not decode or fit is a bad record with a reason.
"""
