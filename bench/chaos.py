"""Chaos: a pipeline with the Spark sink processes N messages while stages are SIGKILLed.

    .venv/bin/python bench/chaos.py --source rabbitmq --messages 50000
    .venv/bin/python bench/chaos.py --source spool --messages 50000 [--json report.json]

What one run does:

1. Writes a config: the ``rabbitmq`` source on a fresh queue with a dead-letter exchange
   (``on_failure = "reject"``, so a failed message shows up in ``<queue>.dlq`` instead of
   vanishing) or the ``spool`` source on a fresh directory; 2 producers, 2 processors, one
   batcher ``spark`` with 2 batch processors, and the Spark sink into a temp dir (the
   daemon's own local Spark Connect server, or ``--spark-remote`` for a shared one).
2. Publishes / writes N messages ``{"uid": i, "pad": …}`` with unique ``uid`` 0…N-1.
3. Starts ``offbroadway run`` and, every ``uniform(0.5, 2)`` s, SIGKILLs one stage picked
   at random: first a kind (producer, processor, batcher, batch processor, the Spark
   server JVM; kinds not killed yet first), then an instance.  Each kill is recorded with
   the child id, pid and the producers' ``inflight`` and ``buffered`` counts (each
   producer's largest in the statuses of the last 3 s, :class:`LoadWindow`).  Once per
   run, when ``daemon_kill_at`` of the source is drained and the tree has settled, the
   daemon itself is SIGKILLed instead; every process of its tree must be gone (psutil)
   before it is started again on the same config and runtime dir.
4. Stops killing when the source is drained (or after ``--kill-seconds``), waits until
   the queue has nothing ready or unacked (``rabbitmqctl list_queues``) / the spool has no
   file left, stops the daemon with SIGTERM (exit 0 expected) and reads the dataset back
   with pyarrow.

Checks (each failure is a line in ``report["problems"]``): every uid is in the output at
least once and nothing else is; the broker holds nothing ready or unacked and the
dead-letter queue is empty (spool: no file left, no dead-letter file); duplicates are at
most the sum of the in-flight counts recorded at the kills; the restart counters of
``status --json`` of each daemon incarnation equal what the supervision tree's strategies
predict for the kills that incarnation took (:func:`expected_restarts`); no process of the
SIGKILLed daemon's tree outlived it; the daemon never gave up and exited 0 on SIGTERM.

Restart intensity.  The defaults allow 3 restarts in 5 s per supervisor (the pipeline
supervisor's own come from ``[pipeline] max_restarts``/``max_seconds``; the killer reads
every supervisor's from the tree the daemon builds, :func:`spec_tree`), and a processor or
batch processor crash is charged to the supervisor *above* its own (their supervisors have
``max_restarts = 0`` and escalate at once): processors and the Spark server to
``PipelineSupervisor``, batchers and batch processors to ``BatcherSupervisor_<key>``,
producers to ``ProducerSupervisor``.  A kill every 0.5-2 s picked blindly would exceed
that (four processor kills inside 5 s happen in a few percent of windows), and the daemon
giving up would then be the test's doing, not a finding.  So the killer keeps OTP's own
books (:class:`KillBudget`): a kill is allowed only while the supervisor it is charged to
has taken at most ``max_restarts - 2`` kills within ``max_seconds`` + 2 s (one restart
stays spare for a secondary crash, the 2 s cover the time between our kill and the
supervisor's count), and only when everything the kill's cascade restarts and every
ancestor is ``running`` (:func:`eligible`: a busy supervisor counts an exit late, which
would compress the spacing the budget assumes, and a restart in progress can be cancelled
by its parent's, which makes restart counts depend on timing).  With those rules any
restart count beyond the kills is the pipeline's own and the intensity never trips by
our hand; if the daemon still gives up, that is reported.

A status is only believed once it has seen every kill (:func:`unseen_kills`).  SIGKILL
is asynchronous: the process dies, then the daemon's loop reads its pidfd, and a status
answered in between shows the killed worker ``running`` with its old pid and the old
restart counters.  Such a status made a kill look eligible while the previous one's
cascade had not begun, and (the flake that found it) made the final books read right after
the last kill, one restart short of the kills.  So no kill, settle or daemon kill goes by
a status in which a killed worker still shows the pid it was killed under; once the new
pid (or none) shows, the worker and its supervisors are in a non-running state until the
whole cascade is done, because the daemon changes them on the same loop turn.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# the script's modules (chaos_plan, chaos_books, chaos_run, chaos_report) sit beside it;
# when imported as bench.chaos (the tests), bench/ is not on sys.path by itself
sys.path.insert(0, str(Path(__file__).resolve().parent))

from chaos_books import (
    classify_exits,
    compare_restarts,
    gave_up,
    output_check,
    restarts_of,
)
from chaos_plan import (
    BUDGET_MARGIN,
    KINDS,
    RESERVE,
    Kill,
    KillBudget,
    LoadWindow,
    all_running,
    charged_supervisor,
    eligible,
    expected_restarts,
    kind_of,
    producer_load,
    spec_tree,
    unseen_kills,
)
from chaos_report import summary
from chaos_run import (
    AMQP_URL,
    BATCHER,
    HANDLER,
    REPO,
    ChaosAbort,
    ChaosOptions,
    ChaosRun,
    Incarnation,
    RabbitSide,
    SpoolSide,
    config_text,
    run_chaos,
)

#: what bench/soak.py and the tests import from here: the entry point keeps every name
__all__ = [
    "AMQP_URL", "BATCHER", "BUDGET_MARGIN", "HANDLER", "KINDS", "REPO", "RESERVE",
    "ChaosAbort", "ChaosOptions", "ChaosRun", "Incarnation", "Kill", "KillBudget",
    "LoadWindow", "RabbitSide", "SpoolSide", "all_running", "charged_supervisor",
    "classify_exits", "compare_restarts", "config_text", "eligible", "expected_restarts",
    "gave_up", "kind_of", "output_check", "producer_load", "restarts_of", "run_chaos",
    "spec_tree", "summary", "unseen_kills",
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", choices=("rabbitmq", "spool"), default="rabbitmq")
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--kill-seconds", type=float, default=None,
                    help="stop killing after this long (default: when the source is drained)")
    ap.add_argument("--gap", type=float, nargs=2, default=(0.5, 2.0), metavar=("MIN", "MAX"))
    ap.add_argument("--spark-kills", type=int, default=None)
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    ap.add_argument("--no-daemon-kill", action="store_true")
    ap.add_argument("--batch-size", type=int, default=500)
    ap.add_argument("--slow", type=float, default=0.0)
    ap.add_argument("--spark-remote", default=None)
    ap.add_argument("--spark-token-env", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the work dir")
    ap.add_argument("--json", default=None, help="write the report here")
    args = ap.parse_args(argv)
    opts = ChaosOptions(
        source=args.source, messages=args.messages, seed=args.seed,
        kill_seconds=args.kill_seconds, min_gap=args.gap[0], max_gap=args.gap[1],
        spark_kills=args.spark_kills, kinds=tuple(args.kinds),
        daemon_kill=not args.no_daemon_kill, batch_size=args.batch_size, slow=args.slow,
        spark_remote=args.spark_remote, spark_token_env=args.spark_token_env, keep=args.keep)
    report = run_chaos(opts)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    print(summary(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
