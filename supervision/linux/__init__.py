"""The Linux mechanisms under a supervised process: fork/exec that cannot outlive its
supervisor (PDEATHSIG, process groups), the guardian that kills what a dead supervisor
left behind, and learning of a child's exit without polling (pidfd, SIGCHLD)."""
