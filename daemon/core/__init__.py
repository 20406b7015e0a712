"""The daemon's pure core: the topology built from the config, the reactions to supervision
events, the drain's terminator, resize and reload plans, the stop budget and the run's
books.  No process, socket or event loop here: the shell acts on what the core decides."""
