# Argument checks of the Cython transport (included by transport_c.pyx).
#
# The same rules and error messages as ``_validation.py`` (which the pure
# twin and the other backends use), written against C types, with fast
# paths for the common exact types.  A str subclass is copied into an exact
# str here, before the lock: no user ``__hash__``/``__eq__`` may run under it.


cdef str _check_id(object value, str name):
    if type(value) is str:
        return <str>value
    if isinstance(value, str):
        # An exact copy: no user __hash__/__eq__ may run under the lock.
        return str.__getitem__(value, slice(None))
    raise TypeError(f"{name} must be a str, not {type(value).__name__}")


cdef str _check_reason(object value):
    """``bury``'s ``reason``: a str; a subclass becomes an exact str."""
    if type(value) is str:
        return <str>value
    if isinstance(value, str):
        return str.__getitem__(value, slice(None))
    raise TypeError(f"reason must be a str, not {type(value).__name__}")


cdef str _check_worker(object value):
    cdef str worker_id = _check_id(value, "worker_id")
    if worker_id == _PARKED_STR:
        raise ValueError(f"worker_id {PARKED!r} is reserved for parked messages")
    return worker_id


cdef int64_t _check_priority(object value, str name) except? -1:
    cdef int overflow = 0
    cdef long long result
    if type(value) is not int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, not {type(value).__name__}")
        value = int(value)
    result = PyLong_AsLongLongAndOverflow(value, &overflow)
    if overflow:
        raise OverflowError(f"{name} {value} is outside the signed 64-bit range")
    return result


cdef inline int64_t _priority(object value, str name) except? -1:
    """``_check_priority`` with a fast path for an exact int in range."""
    cdef int overflow = 0
    cdef long long result
    if type(value) is int:
        result = PyLong_AsLongLongAndOverflow(value, &overflow)
        if not overflow:
            return result
    return _check_priority(value, name)


cdef double _check_duration(object value, str name) except? -1.0:
    cdef double seconds
    if type(value) is float:
        seconds = <double>value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:  # an int beyond float range: it never expires either
            seconds = _INF if value > 0 else -_INF
    else:
        raise TypeError(f"{name} must be an int or float, not {type(value).__name__}")
    if not seconds >= 0.0:  # also catches NaN
        if seconds != seconds:
            raise ValueError(f"{name} must not be NaN")
        raise ValueError(f"{name} must be >= 0, not {value!r}")
    return seconds


cdef double _check_timeout(object value) except? -1.0:
    """``timeout`` of a waiting claim: ``None`` (no deadline) is ``+inf``."""
    if value is None:
        return _INF
    return _check_duration(value, "timeout")


cdef inline int _check_lease(object lease) except -1:
    if type(lease) is not Lease:
        raise TypeError(f"expected a Lease, not {type(lease).__name__}")
    return 0


cdef double _check_time(object value) except? -1.0:
    cdef double now
    if type(value) is not float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise TypeError(f"clock() must return an int or float, not {type(value).__name__}")
        try:
            value = float(value)
        except OverflowError:
            raise ValueError(f"clock() returned {value!r}, which is not finite") from None
    now = <double>value
    if now - now != 0.0:  # NaN or an infinity
        raise ValueError(f"clock() returned {value!r}, which is not finite")
    return now


cdef int64_t _check_count(object value) except -1:
    """``max_count``: an int (not bool) >= 0, with no upper bound (one above
    the signed 64-bit range counts as its maximum: no transport holds more)."""
    cdef int overflow = 0
    cdef long long result
    if type(value) is not int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"max_count must be an int, not {type(value).__name__}")
        value = int(value)
    if value < 0:
        raise ValueError(f"max_count must be >= 0, not {value!r}")
    result = PyLong_AsLongLongAndOverflow(value, &overflow)
    return INT64_MAX if overflow else result


cdef str _check_item(object item, int64_t *priority):
    """One ``publish_many`` item: a tuple ``(group_id, event[, priority[,
    key]])`` (a subclass is read as the tuple it is); returns its group id,
    its priority in ``priority[0]``.  Its key, if any, is checked after
    (``_check_key``), as ``publish`` checks the fields in that order."""
    cdef Py_ssize_t size
    if not PyTuple_Check(item):
        raise TypeError(f"publish_many items must be tuples, not {type(item).__name__}")
    size = PyTuple_GET_SIZE(item)
    if size < 2 or size > 4:
        raise ValueError(f"a publish_many item has 2, 3 or 4 fields, not {size}")
    group_id = _check_id(<object>PyTuple_GET_ITEM(item, 0), "group_id")
    priority[0] = _priority(<object>PyTuple_GET_ITEM(item, 2), "priority") if size >= 3 else 0
    return group_id


cdef object _check_key(object value):
    """``publish``'s ``key``: None or a str; a subclass becomes an exact str."""
    if value is None or type(value) is str:
        return value
    if isinstance(value, str):
        return str.__getitem__(value, slice(None))
    raise TypeError(f"key must be a str or None, not {type(value).__name__}")
