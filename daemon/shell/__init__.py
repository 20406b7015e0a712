"""The daemon's shell: the process that runs the core's decisions against the world (the
event loop, the supervision tree, the hub the stages report to, the control socket,
signals, the runtime directory's lock, sd_notify) and the drain, resize and reload
carried out against the clock."""
