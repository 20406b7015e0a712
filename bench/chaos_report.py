"""The chaos run's report as a human reads it: a few lines from the report dictionary."""

from __future__ import annotations


def summary(report: dict) -> str:
    o = report["options"]
    out = report.get("output", {})
    lines = [
        f"chaos {o['source']}: {o['messages']} messages, {len(report['kills'])} kills "
        f"{report['kills_by_kind']} ({report['kill_outcomes']}), "
        f"kill phase {report.get('kill_phase_s', '?')} s, settle {report.get('settle_s', '?')} s, "
        f"stop {report.get('stop_s', '?')} s, total {report.get('elapsed_s', '?')} s",
        f"  output: {out.get('rows', '?')} rows, {out.get('distinct', '?')} distinct, "
        f"missing {out.get('missing', '?')}, duplicates {out.get('duplicates', '?')} "
        f"(bound {out.get('duplicate_bound', '?')}, max copies {out.get('max_copies', '?')})",
        "  daemons: " + ", ".join(f"#{i['index']} up in {i['up_after']} s, exit "
                                   f"{i['exit_code']}, restarts "
                                   f"{sum(i['final_restarts'].values())}"
                                   for i in report["incarnations"]),
        f"  load: before {tuple(round(x, 2) for x in report['load_before'])}, after "
        f"{tuple(round(x, 2) for x in report['load_after'])}",
        "  OK" if report["ok"] else "  PROBLEMS:\n    " + "\n    ".join(report["problems"]),
    ]
    return "\n".join(lines)
