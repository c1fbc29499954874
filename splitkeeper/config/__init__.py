"""The pipeline file: its models, defaults, JSON Schema and loader, and the core's settings built from it."""
