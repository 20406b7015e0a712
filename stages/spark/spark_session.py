"""The Spark Connect session of a writer: where it connects and with which token, each
call bounded in time, transient failures retried, an earlier incarnation's session settled.

:class:`SparkConnection` is the part of :class:`.spark_sink.SparkSink` that talks to the
server, whatever the call (a commit, a dataset read, the DDL): the channel (TLS with a
private CA, the token read at every connect: :mod:`.spark_remote`), the session and its
configuration (:data:`SESSION_CONF`), one call in a helper thread with heartbeats and a
``write_timeout`` (:meth:`SparkConnection._call`), the bounded tenacity loop
(:meth:`SparkConnection._retrying`), the reachability probe, and the release of sessions
at exit.  The sink sets the attributes it names.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from typing import Any, Callable

import grpc
import tenacity
from pyspark.errors.exceptions.connect import (
    AnalysisException,
    ArithmeticException,
    DateTimeException,
    IllegalArgumentException,
    SparkConnectGrpcException,
    UnsupportedOperationException,
)
from pyspark.sql.connect.client import DefaultChannelBuilder
from pyspark.sql.connect.client.retries import DefaultPolicy
from pyspark.sql.connect.session import SparkSession

from ..runtime.redact import mask_url
from . import spark_remote
from .spark_failures import (
    CallTimeout,
    CommitFailed,
    Permanent,
    WriteAbandoned,
    one_line,
    session_gone,
)

__all__ = ["PERMANENT", "SESSION_CONF", "STOP_GRACE", "SparkConnection", "transient"]

# the sink's logger: its lines read the same whichever part of it speaks
log = logging.getLogger("offbroadway.spark_sink")

#: Set on every session (runtime SQL properties, so they hold on a remote server too):
#: ``ingested_at`` in UTC; timestamps as Parquet TIMESTAMP (microseconds), not the legacy
#: INT96 Spark writes by default; a group of up to thousands of staged files listed by
#: the driver (above the default 32 paths Spark starts a listing *job*: ~0.1 s more).
SESSION_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
}
#: Seconds a Spark call (or the session's release) may still run once the owner stops:
#: well inside the committer's shutdown budget (at least 10 s), long enough for a job
#: that was about to end to end.
STOP_GRACE = 3.0

#: Errors that say "this plan/data is wrong": retrying cannot help.
PERMANENT = (AnalysisException, IllegalArgumentException, UnsupportedOperationException,
             ArithmeticException, DateTimeException)


def transient(exc: BaseException) -> bool:
    """Worth retrying: the server may answer differently in a moment."""
    if isinstance(exc, (CallTimeout, OSError, grpc.RpcError)):
        return True
    if isinstance(exc, PERMANENT):
        return False
    # Everything else the server returned (UNAVAILABLE, session lost or changed,
    # UNAUTHENTICATED after a token rotation, a Spark job aborted by an I/O error…):
    # retried, within the bound.
    return isinstance(exc, SparkConnectGrpcException)


_open_sinks: weakref.WeakSet[SparkConnection] = weakref.WeakSet()


@atexit.register
def _close_open_sinks() -> None:
    """Close live sessions before the interpreter tears grpc down.

    Measured: a process that ends with two Connect sessions still open hangs forever in
    ``SparkSession.__del__`` → ``grpc.Channel.close`` during interpreter shutdown.
    """
    for sink in list(_open_sinks):
        sink.close()


class _ChannelBuilder(DefaultChannelBuilder):
    """pyspark's channel builder, trusting the PEM ``roots`` given (a private CA) instead
    of the bundled ones when the channel is TLS."""

    def __init__(self, url: str, roots: bytes | None) -> None:
        super().__init__(url)
        self._roots = roots

    def toChannel(self) -> grpc.Channel:
        if self._roots is None or not self.use_ssl:
            return super().toChannel()
        creds = grpc.ssl_channel_credentials(root_certificates=self._roots)
        if self.token is not None:
            creds = grpc.composite_channel_credentials(
                creds, grpc.access_token_call_credentials(self.token))
        return self._secure_channel(self.endpoint, creds)


class SparkConnection:
    """One Spark Connect session and the bounded calls through it (see the module
    docstring); :class:`.spark_sink.SparkSink` sets these attributes."""

    remote: str
    token_env: str | None
    token_file: str | None
    use_ssl: bool
    ca_file: str | None
    session_id: str | None
    connect_timeout: float
    write_timeout: float
    write_retry_seconds: float
    on_wait: Callable[[], None]
    should_stop: Callable[[], bool]
    stats: dict[str, int]
    _spark: SparkSession | None
    _permanent_error: str | None

    def _track(self) -> None:
        """Closed at interpreter exit if still open (:func:`_close_open_sinks`)."""
        _open_sinks.add(self)

    def close(self) -> None:
        """Release the server-side session (best effort; call at stage teardown), waiting
        at most :data:`STOP_GRACE` seconds for a server that may be gone: after that the
        channel is closed and the server drops the session on its own."""
        spark, self._spark = self._spark, None
        if spark is None:
            return
        done = threading.Event()

        def release() -> None:
            try:
                spark.stop()
            except Exception:
                pass
            finally:
                done.set()

        threading.Thread(target=release, name="spark-close", daemon=True).start()
        if not done.wait(STOP_GRACE):
            try:
                spark.client.close()
            except Exception:
                pass

    def _retrying(self, fn: Callable[[], Any], what: str) -> Any:
        t0 = time.monotonic()
        attempts = 0

        def attempt() -> Any:
            nonlocal attempts
            attempts += 1
            return fn()

        try:
            return tenacity.Retrying(
                retry=tenacity.retry_if_exception(transient),
                stop=tenacity.stop_after_delay(self.write_retry_seconds),
                wait=tenacity.wait_exponential_jitter(multiplier=0.5, max=5.0, jitter=0.5),
                sleep=self._sleep,
                before_sleep=self._before_sleep,
                reraise=True,
            )(attempt)
        except WriteAbandoned:
            raise
        except Permanent as exc:
            if exc.sticky:
                self._permanent_error = str(exc)
            raise CommitFailed(str(exc), permanent=True) from None
        except Exception as exc:
            took = time.monotonic() - t0
            if transient(exc):
                reason = (f"spark: write failed after {attempts} attempt(s) over {took:.0f} s "
                          f"(retry bound {self.write_retry_seconds:.0f} s): {one_line(exc)}")
                raise CommitFailed(reason) from None
            log.exception("Spark: %s failed", what)
            raise CommitFailed(f"spark: write failed: {one_line(exc)}",
                               permanent=True) from None

    def _session(self) -> SparkSession:
        if self._spark is None:
            spark = SparkSession.builder.channelBuilder(self._builder(self.session_id)).create()
            try:
                # pyspark's own policy retries UNAVAILABLE for ~10 minutes without telling
                # us; keep it to quick blips so our bounded, heartbeating loop is in charge.
                spark.client.set_retry_policies([DefaultPolicy(
                    max_retries=3, initial_backoff=100, max_backoff=1000,
                    backoff_multiplier=3.0, jitter=100, min_jitter_threshold=0)])
                # a job whose client is gone is interrupted by the server instead of going
                # on writing behind the back of the next committer (module docstring)
                spark.client.disable_reattachable_execute()
                for key, value in SESSION_CONF.items():
                    spark.conf.set(key, value)
            except BaseException:
                # A client that never became ours must still be closed: pyspark registers
                # an exit hook per client that, for an open one, sends clean-up calls with
                # its retries to a server that may be gone (a committer that tried a dead
                # server spent 6-9 s in its exit, past its shutdown budget).
                try:
                    spark.client.close()
                except Exception:
                    pass
                raise
            self._spark = spark
        return self._spark

    def _builder(self, session_id: str | None) -> DefaultChannelBuilder:
        roots = None
        if self.ca_file:   # read at every connect, like the token: a renewed CA is picked up
            with open(self.ca_file, "rb") as f:
                roots = f.read()
        builder = _ChannelBuilder(self.remote, roots)
        token = spark_remote.token(self.token_file, self.token_env)
        if token:
            builder.set(DefaultChannelBuilder.PARAM_TOKEN, token)
        if session_id:
            builder.set(DefaultChannelBuilder.PARAM_SESSION_ID, session_id)
        if self.use_ssl:
            builder.set(DefaultChannelBuilder.PARAM_USE_SSL, "true")
        return builder

    def probe(self, timeout: float = 2.0) -> str | None:
        """Whether Spark's endpoint answers now: None when a gRPC connection to it comes
        up (TCP, TLS if any, and the server's HTTP/2 settings: through a relay too) within
        ``timeout``, else why not, on one line.  No call, no token sent; ~10 ms when it
        answers.  What ``status`` says while a job waits (a partition leaves the job's own
        call hanging, without an error, for as long as TCP keeps retrying)."""
        channel = self._builder(None).toChannel()
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout)
            return None
        except grpc.FutureTimeoutError:
            return f"no connection to {mask_url(self.remote)} within {timeout:g} s"
        except Exception as exc:
            return one_line(exc)
        finally:
            channel.close()

    def settle_session(self, session_id: str) -> int:
        """Make sure no operation of the server-side session ``session_id`` (an earlier
        incarnation's, gone) still runs: interrupt them all, then wait, asking the server
        for the session's operations (Spark Connect's ``GetStatus``), until none is running
        or terminating, and release the session.  Returns how many were still live at
        the first look, before the interrupt.

        Why: a job of a committer SIGKILLed mid-commit can go on and finish on the
        server after its client is gone (a cluster that did not see the connection drop:
        a partition, a host that died), and its rows must be in the dataset before the
        next incarnation reads its last commits back or looks redelivered messages up;
        otherwise they land after that check, and the redelivered copies are written a
        second time.  An interrupted job ends at its next task boundary, or once its
        commit is done.  Bounded by ``write_timeout``; retried like a write;
        :class:`CommitFailed` if the server cannot tell."""
        from pyspark.sql.connect.client import SparkConnectClient
        from pyspark.sql.connect.proto import base_pb2

        states = base_pb2.GetStatusResponse.OperationStatus
        live_states = {states.OPERATION_STATE_RUNNING, states.OPERATION_STATE_TERMINATING}
        first: list[int] = []

        def live_ops(client: Any) -> list[str]:
            found = client._get_operation_statuses()
            return [o.operation_id for o in found.operation_statuses
                    if o.state in live_states]

        def settle() -> int:
            client = SparkConnectClient(connection=self._builder(session_id))
            try:
                client.set_retry_policies([DefaultPolicy(
                    max_retries=3, initial_backoff=100, max_backoff=1000,
                    backoff_multiplier=3.0, jitter=100, min_jitter_threshold=0)])
                try:
                    # the first look comes before the interrupt, so what it counts is
                    # what was still running when this incarnation reached the server
                    if not first:
                        first.append(len(live_ops(client)))
                    client.interrupt_all()
                except Exception as exc:
                    if session_gone(exc):   # released, or a server that restarted
                        return 0
                    raise
                deadline = time.monotonic() + self.write_timeout
                while True:
                    live = live_ops(client)
                    if not live:
                        break
                    if time.monotonic() > deadline:
                        raise CallTimeout(f"{len(live)} operation(s) of an earlier session "
                                       f"still running after {self.write_timeout:.0f} s")
                    self.on_wait()
                    self._sleep(0.2)
                try:
                    client.release_session()
                except Exception as exc:
                    if not session_gone(exc):
                        raise
                return first[0]
            finally:
                try:
                    client.close()
                except Exception:
                    pass

        return self._retrying(settle, "waiting for an earlier session's jobs to end")

    def _drop_session(self) -> None:
        """Close the channel (this also cancels an RPC stuck on it) and start afresh later."""
        spark, self._spark = self._spark, None
        if spark is not None:
            try:
                spark.client.close()
            except Exception:
                pass

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` in a helper thread; heartbeat here; give up at ``write_timeout``, or
        :data:`STOP_GRACE` seconds after ``should_stop()`` turned true.

        Why the second bound: a call to a server that died mid-job (or is being restarted
        on the same port) can hang for the whole ``write_timeout``; the owner told to stop
        would then outlive its shutdown budget and be SIGKILLed.  A job still in flight when
        its owner stops is not one the owner will answer anyway (its batches stay unacked,
        and the commit's stamp, journaled before the job, puts its rows in doubt if it did
        commit), so it is abandoned: its channel is closed and the server interrupts it."""
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:
                box["error"] = exc

        thread = threading.Thread(target=target, name="spark-write", daemon=True)
        thread.start()
        now = time.monotonic()
        deadline, beat, stop_at = now + self.write_timeout, now + 1.0, None
        while True:
            thread.join(timeout=0.2)
            if not thread.is_alive():
                break
            now = time.monotonic()
            if now >= beat:
                self.on_wait()
                beat = now + 1.0
            if stop_at is None and self.should_stop():
                stop_at = now + STOP_GRACE
            if stop_at is not None and now >= stop_at:
                self._drop_session()
                raise WriteAbandoned(f"stopping while a Spark call ran (abandoned after "
                                     f"{STOP_GRACE:g} s)")
            if now > deadline:
                self._drop_session()
                raise CallTimeout(f"Spark call still running after {self.write_timeout:.0f} s; "
                               "abandoned")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def _sleep(self, seconds: float) -> None:
        """tenacity's sleep: heartbeat at least once a second while backing off."""
        deadline = time.monotonic() + seconds
        while True:
            self.on_wait()
            if self.should_stop():
                self._drop_session()   # close() must not wait on a server that is gone
                raise WriteAbandoned("stopping while a Spark write was being retried")
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(0.2, left))

    def _before_sleep(self, state: tenacity.RetryCallState) -> None:
        self.stats["retries"] += 1
        exc = state.outcome.exception() if state.outcome else None
        wait = state.next_action.sleep if state.next_action else 0.0
        log.warning("Spark write attempt %d failed (%s); retrying in %.1f s",
                    state.attempt_number, one_line(exc) if exc else "?", wait)
