"""The ``spool`` source (a directory of JSON Lines files, the default that needs no
server), one job per module:

* :mod:`.settings`: the options, validated (pure; what ``check`` uses);
* :mod:`.ledger`: the durable ack ledger as text: settled line ranges written and read
  back, and the cursor that skips them while reading (pure);
* :mod:`.record`: the ledger's files: load (cutting a torn write), append durably,
  fingerprint the spool file a record belongs to;
* :mod:`.reader`: one file's reading state and whole lines out of chunks (oversized lines
  passed over, never held);
* :mod:`.deadletter`: the failure policy, a durable dead-letter file;
* :mod:`.files`: durable writes and moving finished files aside;
* :mod:`.source`: the :class:`~..base.Source` the producer drives (discovery, fetch,
  settle, file lifecycle).

See ``docs/sources.md`` for the options and guarantees.
"""

from .source import SpoolSource

__all__ = ["SpoolSource"]
