"""The epoch job for spark-submit, shipped as package data: ``splitkeeper._data.jobs``."""
