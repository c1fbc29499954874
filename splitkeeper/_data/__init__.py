"""splitkeeper's package data: the top-level folders of the source tree, mapped into the package.

``splitkeeper._data.state``, ``.expectations``, ``.jobs`` and ``.dags`` are the folders
``state/``, ``expectations/``, ``jobs/`` and ``dags/`` (pyproject.toml's
``[tool.setuptools.package-dir]``). A wheel holds them inside this package; the editable
install's finder maps them to the checkout. Read them through :mod:`splitkeeper.resources`.

Imported from a source checkout, the checkout's root joins ``__path__``, so the folders
read are those of the tree splitkeeper was imported from, also under ``PYTHONPATH=<tree>``
with a venv whose editable install points at another checkout (worktrees sharing a venv).
"""

from splitkeeper.resources import checkout_root

_tree = checkout_root()
if _tree is not None:
    __path__.append(str(_tree))
