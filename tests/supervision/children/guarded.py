"""A supervised child that starts grandchildren, as a user's handler might.

    guarded.py PIDFILE [--guard]

With --guard it calls ``guard_descendants()`` first (its spec then has
``pdeathsig=GUARD_SIGNAL``).  It starts two ``sleep`` processes: one in its own process
group, one in a session of its own (``setsid``: it left the group), writes
``{"child": pid, "in_group": pid, "own_session": pid}`` to PIDFILE, reports ready, and idles.
"""

import json
import os
import signal
import subprocess
import sys

from offbroadway.supervision import child


def main() -> int:
    pidfile = sys.argv[1]
    if "--guard" in sys.argv[2:]:
        child.guard_descendants()
    in_group = subprocess.Popen(["sleep", "600"])
    own_session = subprocess.Popen(["sleep", "600"], start_new_session=True)
    tmp = pidfile + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"child": os.getpid(), "in_group": in_group.pid,
                   "own_session": own_session.pid}, f)
    os.rename(tmp, pidfile)
    child.notify_ready()
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())
