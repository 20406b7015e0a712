"""offbroadway: Broadway-style ingestion pipelines on supervised OS processes.

The handler API users import::

    from offbroadway import Pipeline, Message
"""

from .message import BatchInfo, Message
from .pipeline import Pipeline

__all__ = ["BatchInfo", "Message", "Pipeline"]
__version__ = "0.1.0"
