"""``SQLiteTransport``: the contract in a SQLite file shared by processes.

``transport.py`` (the transport), ``waiting.py`` (waiting claims in a process
and the watcher of other processes' commits), ``schema.sql`` and
``queries.sql`` (its SQL, loaded by name).
"""
