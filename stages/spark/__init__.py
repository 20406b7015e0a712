"""The Spark sink: rows to Arrow, the staging area, group commit, the once-only
journal, where the client connects and the Spark Connect session itself.
"""
