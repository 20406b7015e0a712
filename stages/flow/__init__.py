"""Back-pressure and routing, pure and synchronous: demand budgets, dispatchers, windows,
the rate limit, the in-flight table and batch accumulation. No sockets, so every
rule is tested without a process.
"""
