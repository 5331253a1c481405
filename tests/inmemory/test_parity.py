"""The two implementations cannot drift: same public names, signatures and
docstrings for ``InMemoryTransport`` and ``Lease`` (cytoolz's pattern).

Signatures come from ``inspect.signature`` where it works on both sides;
otherwise from a signature line that Cython's ``embedsignature`` put at the
top of the docstring.  Constructors of Cython ``cdef class``es have neither
(their ``__init__`` is a type slot), so the constructor contract is also
checked by calling it: same parameter names, order, defaults and errors.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import time
from types import ModuleType
from typing import Any, Optional

import pytest

import leasequeue
from leasequeue.testing import ManualClock


@pytest.fixture(scope="module")
def pure() -> ModuleType:
    return importlib.import_module("leasequeue._backends.inmemory.transport_py")


@pytest.fixture(scope="module")
def compiled() -> ModuleType:
    try:
        return importlib.import_module("leasequeue._backends.inmemory.transport_c")
    except ImportError as exc:
        if os.environ.get("LEASEQUEUE_NO_EXTENSIONS"):
            pytest.skip("Cython transport disabled by LEASEQUEUE_NO_EXTENSIONS")
        pytest.fail(f"the Cython implementation did not import: {exc!r}")


#: methods every implementation must define with an introspectable signature
SIGNED = {
    "InMemoryTransport": ["publish", "claim", "ack", "nack", "extend", "stats", "close", "__enter__", "__exit__"],
    "Lease": ["__copy__", "__deepcopy__"],
}
#: protocol methods both must define on the class itself (not inherit)
PROTOCOL = {
    "InMemoryTransport": ["__init__", "__len__", "__enter__", "__exit__", "__repr__"],
    "Lease": ["__init__", "__eq__", "__hash__", "__repr__", "__reduce__", "__copy__", "__deepcopy__"],
}
LEASE_FIELDS = ["seq", "group_id", "event", "worker_id", "expires_at", "attempt"]
_EMBEDDED = re.compile(r"^\s*[\w.]+\(.*\)(\s*->\s*.+)?\s*$")


def public_names(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def doc_without_signature(obj: Any) -> str:
    """The docstring, minus a signature line embedded by Cython."""
    doc = inspect.getdoc(obj) or ""
    first, _, rest = doc.partition("\n")
    if _EMBEDDED.match(first):
        return rest.strip()
    return doc.strip()


def signature_of(func: Any) -> Optional[str]:
    try:
        return str(inspect.signature(func))
    except (TypeError, ValueError):
        pass
    first = (getattr(func, "__doc__", None) or "").partition("\n")[0]
    if _EMBEDDED.match(first):
        return first[first.index("(") :].strip()
    return None


def test_same_module_names(pure: ModuleType, compiled: ModuleType) -> None:
    assert sorted(pure.__all__) == sorted(compiled.__all__)
    for name in pure.__all__:
        assert hasattr(compiled, name), name
    assert compiled.TransportStats is pure.TransportStats  # defined once (decisions.md)
    assert compiled.LeaseLost is pure.LeaseLost is leasequeue.LeaseLost


@pytest.mark.parametrize("cls_name", ["InMemoryTransport", "Lease"])
def test_same_public_names(pure: ModuleType, compiled: ModuleType, cls_name: str) -> None:
    py_cls, c_cls = getattr(pure, cls_name), getattr(compiled, cls_name)
    assert public_names(py_cls) == public_names(c_cls)
    for name in PROTOCOL[cls_name]:
        assert name in vars(py_cls), f"pure {cls_name}.{name} missing"
        assert name in vars(c_cls), f"Cython {cls_name}.{name} missing"


def test_lease_fields_in_order(pure: ModuleType, compiled: ModuleType) -> None:
    assert {name for name in public_names(pure.Lease)} == set(LEASE_FIELDS)
    values = [7, "g", object(), "w", 2.5, 3]
    for module in (pure, compiled):
        lease = module.Lease(*values)  # positional: the seed's three fields first
        assert [getattr(lease, name) for name in LEASE_FIELDS] == values
        lease = module.Lease(**dict(zip(LEASE_FIELDS, values)))
        assert [getattr(lease, name) for name in LEASE_FIELDS] == values


@pytest.mark.parametrize("cls_name", ["InMemoryTransport", "Lease"])
def test_same_signatures(pure: ModuleType, compiled: ModuleType, cls_name: str) -> None:
    py_cls, c_cls = getattr(pure, cls_name), getattr(compiled, cls_name)
    for name in sorted(public_names(py_cls) | set(SIGNED[cls_name])):
        py_attr, c_attr = getattr(py_cls, name), getattr(c_cls, name)
        if not callable(py_attr):
            continue  # a field
        py_sig, c_sig = signature_of(py_attr), signature_of(c_attr)
        assert py_sig is not None, f"pure {cls_name}.{name} has no signature"
        assert c_sig is not None, f"Cython {cls_name}.{name} has no signature"
        assert py_sig == c_sig, f"{cls_name}.{name}: {py_sig} != {c_sig}"


@pytest.mark.parametrize("cls_name", ["InMemoryTransport", "Lease"])
def test_same_docstrings(pure: ModuleType, compiled: ModuleType, cls_name: str) -> None:
    py_cls, c_cls = getattr(pure, cls_name), getattr(compiled, cls_name)
    assert doc_without_signature(py_cls), f"pure {cls_name} has no docstring"
    assert doc_without_signature(py_cls) == doc_without_signature(c_cls)
    for name in sorted(public_names(py_cls)) + ["__len__"] * (cls_name == "InMemoryTransport"):
        py_attr, c_attr = getattr(py_cls, name), getattr(c_cls, name)
        if not callable(py_attr):
            continue
        assert doc_without_signature(py_attr), f"pure {cls_name}.{name} has no docstring"
        assert doc_without_signature(py_attr) == doc_without_signature(c_attr), f"{cls_name}.{name}"


def test_transport_constructor_contract(pure: ModuleType, compiled: ModuleType) -> None:
    """What ``inspect.signature(pure.InMemoryTransport)`` says, the Cython
    constructor must do: ``(clock=time.time, *, dedup_window=0.0)``, the
    clock keyword or positional, the window keyword only."""
    params = inspect.signature(pure.InMemoryTransport).parameters
    assert list(params) == ["clock", "dedup_window"] and params["clock"].default is time.time
    assert params["dedup_window"].kind is inspect.Parameter.KEYWORD_ONLY and params["dedup_window"].default == 0.0
    for module in (pure, compiled):
        cls = module.InMemoryTransport
        for t in (cls(clock=ManualClock(7.0)), cls(ManualClock(7.0))):
            t.publish("g", "e")
            assert t.claim("w", 1).expires_at == 8.0
        before = time.time()
        t = cls()  # default: time.time
        t.publish("g", "e")
        assert before + 100 <= t.claim("w", 100).expires_at <= time.time() + 100
        for args, kwargs in (((), {"clock": ManualClock(), "extra": 1}), ((ManualClock(), ManualClock()), {}),
                             ((), {"time": time.time}), ((), {"clock": None}),
                             ((ManualClock(), 5.0), {}), ((), {"dedup_window": "5"}),
                             ((), {"dedup_window": True})):
            with pytest.raises(TypeError):
                cls(*args, **kwargs)
        for window in (-1.0, float("nan")):
            with pytest.raises(ValueError):
                cls(dedup_window=window)
        assert cls(dedup_window=float("inf")).publish("g", "e", key="k") == 1


def test_lease_constructor_contract(pure: ModuleType, compiled: ModuleType) -> None:
    params = inspect.signature(pure.Lease).parameters
    assert list(params) == LEASE_FIELDS
    assert all(p.default is inspect.Parameter.empty for p in params.values())
    for module in (pure, compiled):
        values = [7, "g", object(), "w", 2.5, 3]
        with pytest.raises(TypeError):
            module.Lease(*values[:5])
        with pytest.raises(TypeError):
            module.Lease(*values, 4)
        with pytest.raises(TypeError):
            module.Lease(*values[:5], attempts=1)


def test_same_reprs(pure: ModuleType, compiled: ModuleType) -> None:
    reprs = []
    for module in (pure, compiled):
        t = module.InMemoryTransport(clock=ManualClock())
        t.publish("g", ("ev", 1))
        t.publish("h", None)
        lease = t.claim("w", 2.5)
        reprs.append((repr(lease), repr(t).replace(module.__name__, "<module>"), repr(t.stats())))
    assert reprs[0] == reprs[1]


def _error(call: Any) -> tuple[type, str]:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the error itself is the result
        return type(exc), str(exc)
    raise AssertionError("no error raised")


@pytest.mark.parametrize(
    "bad",
    [
        lambda t, lease: t.claim("w", float("nan")),
        lambda t, lease: t.claim("w", -1),
        lambda t, lease: t.claim("w", "1"),
        lambda t, lease: t.claim(1, 1.0),
        lambda t, lease: t.claim("__parked__", 1.0),
        lambda t, lease: t.claim("w", 1.0, 2**63),
        lambda t, lease: t.claim("w", 1.0, True),
        lambda t, lease: t.nack(lease, float("nan")),
        lambda t, lease: t.nack(lease, -0.5),
        lambda t, lease: t.extend(lease, float("-inf")),
        lambda t, lease: t.publish(b"g", None),
        lambda t, lease: t.publish("g", None, 1.5),
        lambda t, lease: t.ack("not a lease"),
        lambda t, lease: t.claim("w", 1.0, timeout=-1),
        lambda t, lease: t.claim("w", 1.0, timeout=float("nan")),
        lambda t, lease: t.claim("w", 1.0, timeout="1"),
        lambda t, lease: t.claim("w", 1.0, timeout=True),
        lambda t, lease: __import__("asyncio").run(t.aclaim("w", 1.0, timeout=-0.5)),
        lambda t, lease: t.pause(5),
        lambda t, lease: t.set_priority("g", 2**63),
        lambda t, lease: t.set_priority("g", 1.5),
        lambda t, lease: t.claim_many("w", 1.0, -1),
        lambda t, lease: t.claim_many("w", 1.0, 1.5),
        lambda t, lease: t.claim_many("w", 1.0, True),
        lambda t, lease: t.publish_many([["g", None]]),
        lambda t, lease: t.publish_many([("g",)]),
        lambda t, lease: t.publish_many([("g", None, 1, 2)]),
        lambda t, lease: t.publish_many([("g", None, True)]),
        lambda t, lease: t.ack_many([lease, None]),
    ],
)
def test_same_error_messages(pure: ModuleType, compiled: ModuleType, bad: Any) -> None:
    """Both implementations raise the same error type with the same words."""
    errors = []
    for module in (pure, compiled):
        t = module.InMemoryTransport(clock=ManualClock())
        t.publish("g", None)
        lease = t.claim("w", 5.0)
        errors.append(_error(lambda: bad(t, lease)))
    assert errors[0] == errors[1]
    assert "nan" not in errors[0][1] or "NaN" in errors[0][1]


def _package_file(name: str) -> str:
    from importlib import resources

    return (resources.files("leasequeue._backends.inmemory") / name).read_text(encoding="utf-8")


def test_every_pxi_has_its_banner_in_the_pure_twin_in_include_order() -> None:
    """The pure twin is one module with a section per ``.pxi`` file of the
    Cython twin, named after it and in ``transport_c.pyx``'s include order,
    so the two can be read side by side and cannot drift apart unnoticed."""
    from importlib import resources

    included = re.findall(r'^include "([a-z_]+\.pxi)"', _package_file("transport_c.pyx"), re.MULTILINE)
    on_disk = sorted(p.name for p in resources.files("leasequeue._backends.inmemory").iterdir()
                     if p.name.endswith(".pxi"))
    assert sorted(included) == on_disk and len(included) == len(set(included))  # every .pxi included once
    banners = re.findall(r"^# -{3,} ([a-z_]+\.pxi): \S", _package_file("transport_py.py"), re.MULTILINE)
    assert banners == included
