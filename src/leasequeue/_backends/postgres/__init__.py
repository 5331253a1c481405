"""``PostgresTransport``: the contract on a PostgreSQL database (psycopg 3).

``transport.py`` (the transport), ``waiting.py`` (LISTEN/NOTIFY and the wait
room), ``schema.sql`` (tables and server-side functions) and ``queries.sql``
(the statements the transport runs, loaded by name).
"""
