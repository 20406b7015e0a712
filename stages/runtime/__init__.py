"""What every stage process shares: the poll loop, the entry point, heartbeats, logs,
metrics, the spec it starts from and the running of the user's callbacks.
"""
