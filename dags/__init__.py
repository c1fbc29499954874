"""Package data: this folder ships inside the wheel (see splitkeeper/resources.py)."""
