"""The worker's runners: ``threads`` (``Worker.run`` with a plain function)
and ``asyncio`` (``Worker.arun`` with an ``async def``).  Each drives the
shared job flow of ``leasequeue.worker._steps``; a new runner (anyio, a
process pool) implements ``run()`` the same way."""
