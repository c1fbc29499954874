"""The state tables' DDL files (documentation of splitkeeper/delta/schemas.py), shipped as package
data: ``splitkeeper._data.state``."""
