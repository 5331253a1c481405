"""The in-memory transport: two twins that behave identically, and their selector.

* ``transport.py``: the selector: ``InMemoryTransport`` and ``Lease`` of the
  Cython twin when it was built and imports, else of the pure one;
  ``IMPLEMENTATION`` says which (propcache's ``_helpers.py``).
* ``transport_py.py``: the pure-Python twin, one module, where a reader
  learns the algorithm; its sections are named after the ``.pxi`` files.
* ``transport_c.pyx``: the Cython twin; it includes ``lease.pxi``,
  ``validation.pxi``, ``ids.pxi``, ``ready.pxi``, ``expiry.pxi``,
  ``storage.pxi``, ``waiters.pxi`` and ``batch.pxi`` (in that order) and the
  headers ``lq_platform.h`` / ``lq_build.h``; ``transport_c.pyi`` types it.
* ``waiting.py``: blocking and asyncio waiting and the expiry timer, shared
  by both twins.
"""
