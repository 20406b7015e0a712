"""The wire protocol in one place: every frame two stages (or a stage and the daemon)
exchange, and every name of it, for the code that speaks all of it.

Nothing else in the project builds or parses frames.  The protocol lives in one module
per thing it carries, and this module names them all (re-exported: ``protocol.ask``,
``protocol.decode`` … work as they always did):

=====================  ====================================================================
module                 what it carries
=====================  ====================================================================
:mod:`.frames`         the frame ``[VERSION, KIND, *fields]``: version, size limit, every
                       kind and its arity, the field checks, :func:`decode`
:mod:`.subscription`   GenStage's subscription and demand: SUBSCRIBE, SUBSCRIBED, ASK,
                       RETRACT, RETRACTED, CANCEL (and the cancel reasons)
:mod:`.delivery`       messages and their acks: EVENTS, RETURN, BATCH, ACK
:mod:`.envelope`       a message's delivery envelope; messages from events and back
:mod:`.handoff`        the Spark hand-off: HELLO, SCHEMA, COMMIT, RESULT, DRAINED
:mod:`.commands`       the daemon's commands and the stages' reports: COMMAND, REPORT
:mod:`.events`         the events inside EVENTS, RETURN and BATCH frames, in columns
:mod:`.values`         the values codec (msgpack plus datetime, date, time, Decimal, UUID)
=====================  ====================================================================

Each of those modules lists its frames with their direction and fields: the data plane
(GenStage's messages) in :mod:`.subscription` and :mod:`.delivery`, the control plane
(stage ↔ daemon, over the daemon's hub socket) in :mod:`.commands`, the Spark hand-off
(a batch processor and its batcher's committer) in :mod:`.handoff`.
"""

from __future__ import annotations

from . import events as ev  # noqa: F401 (re-exported: protocol.ev.Block)
from .commands import (  # noqa: F401 (re-exported)
    COMMAND_ARGS,
    COMMAND_NAME,
    REPORT_BODY,
    REPORT_NAME,
    command,
    report,
)
from .delivery import (  # noqa: F401 (re-exported)
    ACK_FAILED,
    ACK_OK,
    BATCH_KEY,
    BATCH_PACKED,
    BATCH_TRIGGER,
    EVENTS_BATCH_KEY,
    EVENTS_PACKED,
    EVENTS_STATUS,
    FAILED_REASON,
    FAILED_TOKEN,
    MAX_ACK_RANGE,
    RETURN_PACKED,
    ack,
    acked_tokens,
    batch,
    events,
    give_back,
    message_events,
    open_events,
)
from .envelope import (  # noqa: F401 (re-exported)
    DATA,
    DEFAULT,
    ID,
    METADATA,
    ORIGIN,
    TOKEN,
    ack_groups,
    address,
    envelope_of,
    event_id,
    event_origin,
    event_to_message,
    event_token,
    new_events,
    to_messages,
)
from .frames import (  # noqa: F401 (re-exported)
    ACK,
    ASK,
    BATCH,
    CANCEL,
    COMMAND,
    COMMIT,
    DRAINED,
    EVENTS,
    HELLO,
    KIND_AT,
    KIND_NAMES,
    MAX_FRAME_BYTES,
    REPORT,
    RESULT,
    RETRACT,
    RETRACTED,
    RETURN,
    SCHEMA,
    SUBSCRIBE,
    SUBSCRIBED,
    VALUE,
    VERSION,
    ZMQ_EVENTS,
    ZMQ_POLLIN,
    ProtocolError,
    decode,
    frames_within_limit,
)
from .handoff import (  # noqa: F401 (re-exported)
    COMMIT_FILE,
    COMMIT_REF,
    COMMIT_ROWS,
    COMMIT_SCHEMA,
    COMMIT_TRIGGER,
    RESULT_ERROR,
    RESULT_REF,
    RESULT_SCHEMA,
    SCHEMA_ERROR,
    SCHEMA_IPC,
    SCHEMA_STAGING,
    commit,
    drained,
    hello,
    result,
    schema,
)
from .subscription import (  # noqa: F401 (re-exported)
    CANCEL_BAD_SUBSCRIPTION,
    CANCEL_LEAVING,
    CANCEL_SHUTDOWN,
    CANCEL_UNKNOWN,
    CANCEL_UNSUBSCRIBED,
    SUBSCRIBE_MAX,
    SUBSCRIBE_MIN,
    SUBSCRIBE_PARTITION,
    SUBSCRIBE_REF,
    SUBSCRIBED_POLICY,
    SUBSCRIBED_REF,
    ask,
    cancel,
    retract,
    retracted,
    subscribe,
    subscribed,
)
from .values import (  # noqa: F401 (re-exported: one codec, two names)
    CARRIED,
    EXT_DATE,
    EXT_DATETIME,
    EXT_DECIMAL,
    EXT_TIME,
    EXT_UUID,
    UNPACK_OPTIONS,
    _pack,
    _unpack,
    message_unpackable,
    packable,
    unpackable,
)
