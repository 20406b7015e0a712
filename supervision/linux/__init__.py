"""Two kernel mechanisms a supervisor stands on, each self-contained (standard library only,
nothing else of the package): learning of a child's exit without polling (pidfd, SIGCHLD),
and the guardian that kills what a dead supervisor's children left behind."""
