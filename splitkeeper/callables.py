"""The one rule for the code a pipeline file names: a callable qualifies only when its own module
marks it for the place that names it.

A pipeline file names code in these places, each with its :class:`Role` and its mark:

================================  =======================  =============================================
place                             role                     the module marks it with
================================  =======================  =============================================
``transform`` (kind ``python``)   :attr:`Role.TRANSFORM`   ``@transform``, ``@vectorized`` or
                                                           ``@batch_transform``
``transform: {kind: spark}``      ``SPARK_TRANSFORM``      ``@spark_transform``
``notifications.on_failure``      ``NOTIFICATION``         ``@notification``
``checks.actions`` (each)         ``CHECKPOINT_ACTION``    ``@checkpoint_action``
================================  =======================  =============================================

(A ``checks.actions`` function returns the Great Expectations ``ValidationAction`` the restart
checks' checkpoint runs: :func:`splitkeeper.quality.checks.resolve_actions` checks what it returns.)
Every place resolves its name through :func:`resolve_callable`, at load (so
a mistake fails at submission) and again where the code runs. Anything its module did not mark for
that role is refused with :class:`~splitkeeper.errors.ConfigError` naming the key and the decorator
to use: ``os:system``, ``sys:exit``, ``code:interact``, ``shutil:rmtree``, ``builtins:eval``, a
class, a function of another role, a marked function reached through a dunder attribute. The mark
is an attribute the decorator sets on the function itself (no wrapper), so a marked function still
pickles by module and name and keeps its mark on an executor.

This module imports the standard library and :mod:`splitkeeper.errors` only.
"""

from __future__ import annotations

import enum
import importlib
import pickle
from collections.abc import Callable
from typing import Any, TypeVar

from splitkeeper.errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])


class Role(enum.Enum):
    """What a named callable is for: its mark attribute, what it is called, its decorators, and
    what a config key naming it allows."""

    TRANSFORM = (
        "__splitkeeper_transform__",
        "a transform",
        "@transform (from splitkeeper import transform)",
        "'module:function' naming a module-level function marked @transform, (value: str) -> str (or "
        "@vectorized, pa.Array -> pa.Array, or @batch_transform, pa.RecordBatch -> pa.RecordBatch), "
        "importable on the executors",
    )
    SPARK_TRANSFORM = (
        "__splitkeeper_spark_transform__",
        "a Spark transform",
        "@spark_transform (from splitkeeper import spark_transform)",
        "'module:function' naming a module-level function marked @spark_transform, "
        "fn(pyspark.sql.DataFrame) -> DataFrame, importable on the driver",
    )
    NOTIFICATION = (
        "__splitkeeper_notification__",
        "a notification",
        "@notification (from splitkeeper import notification)",
        "'module:function' naming a module-level function marked @notification, fn(event: dict) -> None, "
        "importable where the Airflow tasks run",
    )
    CHECKPOINT_ACTION = (
        "__splitkeeper_checkpoint_action__",
        "a checkpoint action",
        "@checkpoint_action (from splitkeeper import checkpoint_action)",
        "'module:function' naming a module-level function marked @checkpoint_action, fn() -> an "
        "instance of a great_expectations.checkpoint.ValidationAction subclass (e.g. "
        "SlackNotificationAction), importable where the validate task runs",
    )

    @property
    def attribute(self) -> str:
        return str(self.value[0])

    @property
    def noun(self) -> str:
        return str(self.value[1])

    @property
    def decorator(self) -> str:
        return str(self.value[2])

    @property
    def allowed(self) -> str:
        return str(self.value[3])


def mark(function: F, role: Role) -> F:
    """``function`` itself, marked as a callable a config may name for ``role``."""
    setattr(function, role.attribute, True)
    return function


def is_marked(candidate: Any, role: Role) -> bool:
    """Whether ``candidate``'s own attributes carry the mark of ``role`` (never a value a
    ``__getattr__`` makes up, nor a mark of a class it belongs to)."""
    own = getattr(candidate, "__dict__", None)
    return isinstance(own, dict) and own.get(role.attribute) is True


def spark_transform(function: F) -> F:
    """Mark ``function`` as a Spark transform a pipeline config may name:
    ``fn(pyspark.sql.DataFrame) -> DataFrame`` (``transform: {kind: spark, function: 'module:fn'}``)."""
    return mark(function, Role.SPARK_TRANSFORM)


def notification(function: F) -> F:
    """Mark ``function`` as a failure notification a pipeline config may name:
    ``fn(event: dict) -> None`` (``notifications.on_failure``)."""
    return mark(function, Role.NOTIFICATION)


def checkpoint_action(function: F) -> F:
    """Mark ``function`` as a Great Expectations action factory a pipeline config may name:
    ``fn() -> great_expectations.checkpoint.ValidationAction`` (``checks.actions``); the restart
    checks' checkpoint runs the action it returns after the Data Docs update."""
    return mark(function, Role.CHECKPOINT_ACTION)


def resolve_callable(spec: str, key: str, role: Role) -> Callable[..., Any]:
    """The module-level function ``'module:function'`` names, if its module marked it for ``role``.

    Imports the module (attribute paths allowed after ``:``, no dunder part). ConfigError naming
    ``key`` when the spec is malformed, the module or attribute is missing, the target is not
    callable, is not marked for ``role``, or does not pickle by reference. May be called any number
    of times (modules are cached).
    """
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise callable_error(spec, "the spec has no ':' between module and function", key, role)
    parts = attr_path.split(".")
    if any(p.startswith("__") and p.endswith("__") for p in parts):
        raise callable_error(spec, f"{attr_path!r} reaches through a dunder attribute", key, role)
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise callable_error(
            spec,
            f"module {module_name!r} cannot be imported ({err}); install it or add it to PYTHONPATH "
            "on the driver and the executors",
            key,
            role,
        ) from err
    target: Any = module
    for part in parts:
        try:
            target = getattr(target, part)
        except AttributeError as err:
            raise callable_error(
                spec, f"module {module_name!r} has no attribute {attr_path!r}", key, role
            ) from err
    if not callable(target):
        raise callable_error(spec, f"{attr_path!r} is a {type(target).__name__}, not a function", key, role)
    if not is_marked(target, role):
        others = [r for r in Role if r is not role and is_marked(target, r)]
        also = f" (it is marked as {others[0].noun})" if others else ""
        raise callable_error(
            spec,
            f"{spec} is not marked as {role.noun}{also}; if it is your {role.noun.split(' ', 1)[1]}, "
            f"decorate it in its module with {role.decorator}",
            key,
            role,
        )
    try:
        same = pickle.loads(pickle.dumps(target)) is target
    except Exception as err:  # noqa: BLE001 - any pickling failure means "not by reference"
        raise callable_error(
            spec, f"it cannot be pickled by reference ({err}); use a module-level def", key, role
        ) from err
    if not same:
        raise callable_error(spec, "it does not pickle by reference; use a module-level def", key, role)
    function: Callable[..., Any] = target
    return function


def callable_error(spec: str, why: str, key: str, role: Role) -> ConfigError:
    """The house-format error of a callable ``key`` names: what is allowed there, and why not."""
    return ConfigError(
        f"{key}={spec!r} is not allowed: {role.allowed}; {why}", key=key, value=spec, allowed=role.allowed
    )
