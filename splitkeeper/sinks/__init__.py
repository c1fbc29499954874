"""The sink kinds: one package per kind (:mod:`.delta`, the default), each behind the sink port
(:mod:`.port`: commit, rewind, upkeep, side tables, reads), which is all the application, the
checks and the report know of a sink. A third party's kind is its own distribution
(:mod:`splitkeeper.kinds`).
"""
