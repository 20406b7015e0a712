"""What crosses a socket: the frame codec and the daemon ↔ stage command vocabulary.
Every frame is built and parsed here, so both ends read one definition.
"""
