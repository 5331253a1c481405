"""A configured handler: :class:`Task` / :func:`task`.

The handler together with what it needs to run (its retry policy, hooks,
middleware, priority floor), as ``dramatiq`` actors and ``procrastinate``
tasks carry theirs: ``Worker(transport, task)`` takes them as its defaults,
and ``leasequeue worker MODULE:TASK`` loads them from code.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, TypeVar, Union, overload

from ._middleware import OUTCOMES, Hook, Middleware, check_middleware
from ._retry import Retry

__all__ = ["Task", "is_async", "task"]

F = TypeVar("F", bound=Callable[..., Any])


def is_async(handler: Any) -> bool:
    """Whether ``handler`` is an ``async def`` function (or an object with an
    ``async def __call__``, or a :class:`Task` of one)."""
    if isinstance(handler, Task):
        return handler.is_async
    if inspect.iscoroutinefunction(handler):
        return True
    call = getattr(handler, "__call__", None)  # noqa: B004 - an object with an async __call__
    return call is not None and inspect.iscoroutinefunction(call)


def check_hooks(hooks: Any) -> Dict[str, Tuple[Hook, ...]]:
    if not isinstance(hooks, dict):
        raise TypeError(f"hooks must be a dict {{outcome: f(job, error)}}, not {type(hooks).__name__}")
    checked: Dict[str, Tuple[Hook, ...]] = {}
    for outcome, fn in hooks.items():
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r}: one of {', '.join(OUTCOMES)}")
        if not callable(fn):
            raise TypeError(f"hook must be callable, not {type(fn).__name__}")
        checked[outcome] = (fn,)
    return checked


def check_min_priority(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"min_priority must be an int, not {type(value).__name__}")
    return value


class Task:
    """A handler with its options: ``Task(handler, *, retry=None, hooks=None,
    middleware=(), min_priority=None)``.

    Callable like its handler (``task(job)`` calls ``handler(job)``; an
    ``async def`` handler's task returns its coroutine).  Given to
    :class:`~leasequeue.Worker` in place of a handler, its options are the
    worker's defaults; a keyword given to ``Worker(...)`` wins over the
    task's (it replaces it: ``hooks=`` given to the worker replaces the
    task's hooks, it does not add to them).  ``None`` (and ``()`` for
    ``middleware``) means "not set here".  Options are checked when the task
    is made, as ``Worker`` checks them.
    """

    def __init__(
        self,
        handler: Callable[..., Any],
        *,
        retry: Optional[Retry] = None,
        hooks: Optional[Dict[str, Hook]] = None,
        middleware: Union[Middleware, Sequence[Middleware]] = (),
        min_priority: Optional[int] = None,
    ) -> None:
        if isinstance(handler, Task):
            raise TypeError("handler is already a Task: give its options to that Task")
        if not callable(handler):
            raise TypeError(f"handler must be callable, not {type(handler).__name__}")
        if retry is not None and not isinstance(retry, Retry):
            raise TypeError(f"retry must be a leasequeue.Retry, not {type(retry).__name__}")
        self.handler = handler
        self.retry = retry
        self.hooks: Optional[Dict[str, Hook]] = None
        if hooks is not None:
            check_hooks(hooks)
            self.hooks = dict(hooks)
        self.middleware: Tuple[Middleware, ...] = tuple(check_middleware(middleware))
        self.min_priority = None if min_priority is None else check_min_priority(min_priority)
        functools.update_wrapper(self, handler, updated=())

    @property
    def is_async(self) -> bool:
        """Whether the handler is an ``async def`` (the worker runs it on asyncio)."""
        return is_async(self.handler)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.handler(*args, **kwargs)

    def __repr__(self) -> str:
        name = getattr(self.handler, "__qualname__", None) or repr(self.handler)
        options = [f"retry={self.retry!r}"] if self.retry is not None else []
        if self.hooks:
            options.append(f"hooks={sorted(self.hooks)!r}")
        if self.middleware:
            options.append(f"middleware={list(self.middleware)!r}")
        if self.min_priority is not None:
            options.append(f"min_priority={self.min_priority}")
        return f"<Task {name}{' ' if options else ''}{', '.join(options)}>"


@overload
def task(handler: Callable[..., Any], *, retry: Optional[Retry] = ..., hooks: Optional[Dict[str, Hook]] = ...,
         middleware: Union[Middleware, Sequence[Middleware]] = ..., min_priority: Optional[int] = ...) -> Task: ...


@overload
def task(handler: None = ..., *, retry: Optional[Retry] = ..., hooks: Optional[Dict[str, Hook]] = ...,
         middleware: Union[Middleware, Sequence[Middleware]] = ...,
         min_priority: Optional[int] = ...) -> Callable[[Callable[..., Any]], Task]: ...


def task(
    handler: Optional[Callable[..., Any]] = None,
    *,
    retry: Optional[Retry] = None,
    hooks: Optional[Dict[str, Hook]] = None,
    middleware: Union[Middleware, Sequence[Middleware]] = (),
    min_priority: Optional[int] = None,
) -> Union[Task, Callable[[Callable[..., Any]], Task]]:
    """Make a :class:`Task`: as a decorator, bare (``@task``) or with options
    (``@task(retry=Retry(max_attempts=3))``), or called (``task(f, ...)``)."""
    def make(fn: Callable[..., Any]) -> Task:
        return Task(fn, retry=retry, hooks=hooks, middleware=middleware, min_priority=min_priority)

    if handler is None:
        return make
    return make(handler)
