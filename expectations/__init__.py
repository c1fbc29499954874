"""The Great Expectations suites, shipped as package data: ``splitkeeper._data.expectations``."""
