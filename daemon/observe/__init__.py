"""What the daemon shows of itself: the ``/metrics`` endpoint and its multiprocess
directory, the live page on the same listener, and the timeline of recent events."""
