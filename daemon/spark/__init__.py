"""The Spark side of the daemon: the ``spark`` child and the sink settings the committers
get, the Spark Connect server that child runs (a JVM, one per daemon), and the sessions
``offbroadway spark verify`` and ``spark sql`` open on the output."""
