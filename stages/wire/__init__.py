"""What crosses a socket: the frame, one module per thing frames carry (subscription and
demand, messages and acks, the Spark hand-off, the daemon ↔ stage commands), the events
and values inside them; :mod:`.protocol` names them all.  Every frame is built and parsed
here, so both ends read one definition.
"""
