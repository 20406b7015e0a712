"""What every stage process shares: the poll loop, heartbeats, logs, metrics, the spec it
starts from and the running of the user's callbacks (the entry point that ties them to the
roles is :mod:`offbroadway.stages.worker`, above this folder).
"""
