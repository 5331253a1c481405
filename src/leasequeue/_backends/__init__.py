"""The backends: one folder each, and what they share beside them.

=================  ==========================================================
``inmemory/``      the in-memory transport: the selector (``transport``), the
                   pure twin (``transport_py``), the Cython twin
                   (``transport_c.pyx`` with its ``.pxi`` files and headers),
                   and the waiting layer both twins share (``waiting``)
``sqlite/``        ``SQLiteTransport``: transport, waiting, schema and queries
``postgres/``      ``PostgresTransport``: transport, waiting, schema and queries
``durable.py``     what the durable backends share: lease fencing and decoding
``sqlfiles.py``    loading a backend's ``.sql`` files by name
=================  ==========================================================

This module itself imports nothing: it maps each public backend name to the
module that defines it (strings, kombu's ``TRANSPORT_ALIASES``), and
:func:`load` imports a backend on first use, turning a missing optional
driver into an error that names the extra to install.  ``leasequeue``'s
``__getattr__`` and the command lines share this table.
"""

from __future__ import annotations

import importlib
from typing import Any, Dict, Optional, Tuple

__all__ = ["BACKENDS", "load"]

#: public name -> (module, attribute, the extra that brings its driver or None)
BACKENDS: Dict[str, Tuple[str, str, Optional[str]]] = {
    "InMemoryTransport": ("leasequeue._backends.inmemory.transport", "InMemoryTransport", None),
    "PyInMemoryTransport": ("leasequeue._backends.inmemory.transport_py", "InMemoryTransport", None),
    "SQLiteTransport": ("leasequeue._backends.sqlite.transport", "SQLiteTransport", None),
    "PostgresTransport": ("leasequeue._backends.postgres.transport", "PostgresTransport", "postgres"),
}

#: the driver each optional backend needs (the top-level module name)
_DRIVERS = {"postgres": "psycopg"}

_loaded: Dict[str, Any] = {}


def load(name: str) -> Any:
    """The backend class called ``name`` (a key of :data:`BACKENDS`), imported on first use.

    A missing driver raises ``ImportError`` (``ModuleNotFoundError``) whose
    message names the extra: ``pip install 'leasequeue[postgres]'``.
    """
    try:
        return _loaded[name]
    except KeyError:
        pass
    module_name, attribute, extra = BACKENDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        driver = _DRIVERS.get(extra or "")
        if driver is None or exc.name is None or exc.name.split(".")[0] != driver:
            raise
        raise ModuleNotFoundError(
            f"leasequeue.{name} needs {driver}, which is not installed: "
            f"pip install 'leasequeue[{extra}]'",
            name=exc.name,
        ) from exc
    value = getattr(module, attribute)
    _loaded[name] = value
    return value
