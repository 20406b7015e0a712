"""``offbroadway test CONFIG FIXTURES [--expect FILE]``: the pipeline run on fixture messages
in one process, as far as the rows Spark would get, without a process tree or a JVM.

Why: a green unit test for rows the pipeline then rejects cost a Spark user the hour; Vector
and Redpanda Connect users ask for the same (fixtures through the real topology).  This
loads the config's handler and runs each fixture through what the daemon runs
(:func:`offbroadway.testing.run`: the wire codec between the stages, the routing to
batchers, the batcher's cut, ``handle_batch``, and for ``[spark]`` the conversion to Arrow
against the dataset's schema: its DDL, else the existing dataset's, else inferred), then
prints each batcher's rows and the schema Spark would write, and each message that would
fail and why.  Exit 0 when none fails, 3 when some do (as ``run --until-idle``), 1 when
``--expect``'s rows differ, 2 for a config or fixture file that cannot be read.

Fixtures are JSON Lines (a file, or a directory of ``*.jsonl`` files read in name order),
one message per line, as the source delivers it: the spool (and a source of your own)
gives the parsed line, a line that is not JSON arrives failed with the spool's reason;
RabbitMQ and NATS deliver the line's bytes, decoded as their ``decode`` option says;
Redis's field map is the line's JSON object.  Ids are ``<file>:<line>``, as the spool's.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from ..config.records import Config

#: sources whose message data is the payload's bytes (decoded by their ``decode`` option)
BYTES_SOURCES = ("rabbitmq", "nats")


class FixtureError(ValueError):
    """The fixtures cannot be read (one line, naming the file)."""


def fixture_files(path: str) -> list[str]:
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".jsonl"))
        if not files:
            raise FixtureError(f"{path}: no *.jsonl file in the directory")
        return files
    if not os.path.isfile(path):
        raise FixtureError(f"{path}: no such file or directory")
    return [path]


def read_fixtures(path: str, config: Config) -> list[tuple]:
    """``(id, data, metadata, failed reason or None)`` per line, as the source gives it."""
    from offbroadway.stages.sources.decode import body_decoder, json_value, why_not

    source = config.producer.source
    decode = body_decoder(str(config.producer.options.get("decode", "none"))) \
        if source in BYTES_SOURCES else None
    items: list[tuple] = []
    for file in fixture_files(path):
        name = os.path.basename(file)
        try:
            with open(file, "rb") as f:
                lines = f.read().splitlines()
        except OSError as exc:
            raise FixtureError(f"{file}: {exc.strerror or exc}") from None
        for n, raw in enumerate(lines, 1):
            if not raw.strip():
                continue
            msg_id, meta = f"{name}:{n}", {"file": name, "line": n}
            if source in BYTES_SOURCES:
                if decode is None:
                    items.append((msg_id, raw, meta, None))
                    continue
                try:
                    items.append((msg_id, decode(raw), meta, None))
                except (ValueError, RecursionError) as exc:
                    items.append((msg_id, raw, meta, why_not(exc, "body")))
                continue
            try:
                items.append((msg_id, json_value(raw), meta, None))
            except (ValueError, RecursionError) as exc:
                items.append((msg_id, raw.decode(errors="replace"), meta,
                              f"line is not valid JSON: {exc}"))
    return items


def _plain(value: Any) -> Any:
    """A row value as JSON shows it (datetimes and Decimals as text, bytes as text)."""
    return json.loads(json.dumps(value, default=lambda v: v.decode(errors="replace")
                                 if isinstance(v, bytes) else str(v)))


def rehearse(config: Config, fixtures: str, expect: str | None = None,
             out: Any = sys.stdout) -> int:
    from offbroadway import testing
    from offbroadway.stages.runtime.handler import load_handler

    from ..core.outcome import EXIT_FAILED

    items = read_fixtures(fixtures, config)
    handler = load_handler(config.pipeline.handler)
    targets = testing.targets_from_config(config)
    result = testing.run(handler, items, context=dict(config.pipeline.context),
                         batchers={k: b.batch_size for k, b in config.batchers.items()},
                         batch_bytes=[k for k, b in config.batchers.items() if b.batch_bytes],
                         spark=targets)
    rows = _rows(result, config)
    for key, batch_rows in rows.items():
        print(f"rows for {key} ({len(batch_rows)}):", file=out)
        for row in batch_rows:
            print("  " + json.dumps(row, sort_keys=False), file=out)
        if key in result.schemas:
            from offbroadway.stages.spark.spark_schema import spark_struct

            from ..spark.verify import ddl

            print(f"schema for {key} ({result.schema_sources[key]}): "
                  f"{ddl(spark_struct(result.schemas[key]))}", file=out)
    if result.discarded:
        print(f"discarded ({len(result.discarded)}): "
              f"{', '.join(str(m.id) for m in result.discarded)}", file=out)
    print(f"failed ({len(result.failed)}):", file=out)
    for m in result.failed:
        print(f"  {m.id}: {m.status}", file=out)
    code = EXIT_FAILED if result.failed else 0
    if expect is not None:
        diff = compare(rows, expect)
        for line in diff:
            print(line, file=out)
        if diff:
            return 1
        print(f"rows as expected ({sum(map(len, rows.values()))})", file=out)
    return code


def _rows(result: Any, config: Config) -> dict[str, list[dict]]:
    """Each batcher's rows: with Spark, the table Spark would get (data columns and
    ``message_id``), else the data of the messages ``handle_batch`` returned."""
    out: dict[str, list[dict]] = {key: [] for key in config.batchers} or {"": []}
    if config.spark is not None:
        for key, table in result.tables.items():
            out[key] = [_plain(r) for r in table.to_pylist()]
        return out
    for m in result.successful:
        data = m.data if isinstance(m.data, dict) else {"data": m.data}
        out.setdefault(m.batcher if config.batchers else "", []).append(
            _plain({**data, "message_id": m.id}))
    return out


def compare(rows: dict[str, list[dict]], expect: str) -> list[str]:
    """Lines saying how the rows differ from ``expect`` (JSON Lines; a ``batcher`` field
    says whose row it is when there are several; fields an expected row leaves out, such
    as ``message_id``, are not compared); none when they match, in any order."""
    try:
        with open(expect) as f:
            wanted = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as exc:
        raise FixtureError(f"{expect}: {exc}") from None
    only = next(iter(rows)) if len(rows) == 1 else None
    by_key: dict[str, list[dict]] = {}
    for row in wanted:
        key = row.pop("batcher", only)
        by_key.setdefault(str(key), []).append(row)
    lines: list[str] = []
    for key in sorted(set(rows) | set(by_key)):
        got = list(rows.get(key, []))
        for row in by_key.get(key, []):
            match = next((i for i, g in enumerate(got)
                          if {k: g.get(k) for k in row} == row), None)
            if match is None:
                lines.append(f"missing from {key}: {json.dumps(row)}")
            else:
                del got[match]
        lines += [f"not expected in {key}: {json.dumps(g)}" for g in got]
    return lines
