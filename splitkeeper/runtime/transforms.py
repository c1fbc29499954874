"""Alias of :mod:`splitkeeper.transforms` for pipeline files that name ``splitkeeper.runtime.transforms:...``.

The functions are the same objects, marked ``@transform`` where they are defined, so a file
naming either module resolves to the same transform.
"""

from splitkeeper.transforms import enrich_json, identity

__all__ = ["enrich_json", "identity"]
