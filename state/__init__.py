"""The state tables' DDL files, shipped as package data: ``splitkeeper._data.state``."""
