"""A durable JetStream pull consumer as a :class:`StreamInput` (nats-py, driven by a private event loop).

Exactly once: the batch's stream sequence range is its id in the Iceberg commit, and messages are
acknowledged only after it. After a crash the consumer holds delivered, unacknowledged messages that
JetStream would re-deliver only after ``ack_wait`` -- and meanwhile hand out newer ones, out of order. So a
read that finds unacknowledged messages (one writer per line: their reader is gone) re-creates the durable
consumer at its acknowledgement floor: the next fetch re-delivers them in stream order, the ledger skips the
committed ones (acknowledged, not written) and the rest continue in order. The stream keeps the messages
(limits or work-queue retention; an interest-retention stream would drop them with the consumer).
"""

import asyncio
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

from icecdc_dagster.errors import StreamInputError
from icecdc_dagster.inputs.base import Lag, LedgerView, Message, StreamBatch, StreamInput, ledger_view, split_batch
from icecdc_dagster.inputs.nats_jetstream.config import NatsJetStreamConfig

T = TypeVar("T")


class NatsJetStreamInput(StreamInput):
    def __init__(self, config: NatsJetStreamConfig) -> None:
        self.config = config
        self._loop = asyncio.new_event_loop()
        self._nc: Any = None
        self._js: Any = None

    @property
    def source(self) -> str:
        return self.config.source

    def position_key(self, position: str) -> int:
        return int(position)

    def _run(self, coro: Awaitable[T]) -> T:
        return self._loop.run_until_complete(coro)

    def _connect(self) -> Any:
        if self._js is None:
            import nats  # nats-py: ~0.2 s, a NATS input only

            c = self.config
            options: dict[str, Any] = {"servers": [c.url], "connect_timeout": 5, "max_reconnect_attempts": 2,
                                       "allow_reconnect": False}
            if c.user is not None:
                options["user"] = c.user if isinstance(c.user, str) else c.user.resolve()
            if c.password is not None:
                options["password"] = c.password.resolve()
            if c.token is not None:
                options["token"] = c.token.resolve()
            try:
                self._nc = self._run(nats.connect(**options))
            except Exception as exc:  # noqa: BLE001 - every connect failure names the input
                raise StreamInputError(f"{self.config.describe()}: cannot connect: {exc!r}") from exc
            self._js = self._nc.jetstream()
        return self._js

    def _consumer_info(self) -> Any:
        from nats.js.errors import NotFoundError  # nats-py: ~0.2 s, a NATS input only

        try:
            return self._run(self._connect().consumer_info(self.config.stream, self.config.durable))
        except NotFoundError:
            return None

    def _ensure_consumer(self) -> None:
        """Create the durable consumer, or re-create it at its acknowledgement floor when it holds
        unacknowledged messages of a dead reader (see the module docstring)."""
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy  # nats-py: ~0.2 s, a NATS input only

        c = self.config
        info = self._consumer_info()
        start: int | None = None
        if info is not None and not info.num_ack_pending:
            return
        if info is not None:
            start = int(info.ack_floor.stream_seq) + 1
            self._run(self._js.delete_consumer(c.stream, c.durable))
        config = ConsumerConfig(durable_name=c.durable, filter_subject=c.subject, ack_policy=AckPolicy.EXPLICIT,
                                deliver_policy=DeliverPolicy.ALL if start is None else DeliverPolicy.BY_START_SEQUENCE,
                                opt_start_seq=start, ack_wait=c.ack_wait_s, max_ack_pending=c.max_messages)
        self._run(self._connect().add_consumer(c.stream, config=config))

    def read(self, recorded: Mapping[str, bool]) -> StreamBatch:
        from nats.errors import TimeoutError as NatsTimeout  # nats-py: ~0.2 s, a NATS input only

        self._ensure_consumer()
        view = ledger_view(self.source, recorded, self.position_key)
        sub = self._run(self._js.pull_subscribe_bind(durable=self.config.durable, stream=self.config.stream))
        fetched: list[Message] = []
        try:
            while len(fetched) < self.config.max_messages or _before_partial_end(fetched, view):
                want = max(self.config.max_messages - len(fetched), 1)
                try:
                    msgs = self._run(sub.fetch(batch=want, timeout=self.config.fetch_wait_s))
                except (NatsTimeout, TimeoutError):  # nats-py raises either when nothing more waits
                    break
                if not msgs:
                    break
                fetched.extend(Message(str(m.metadata.sequence.stream), m.data or b"", m) for m in msgs)
        finally:
            self._run(sub.unsubscribe())
        fetched.sort(key=lambda m: int(m.position))
        return split_batch(self.source, fetched, view, self.position_key)

    def acknowledge(self, batch: StreamBatch) -> None:
        """Acknowledge and wait for JetStream to confirm each ack (double ack), so the lag read right after
        is the consumer's real state, not one that still counts the acks in flight. An ack that is not
        confirmed is harmless: JetStream delivers the message again and the ledger skips it."""
        async def ack_all() -> None:
            await asyncio.gather(*(m.handle.ack_sync(timeout=5.0) for m in (*batch.already_committed,
                                                                             *batch.messages)),
                                 return_exceptions=True)

        if batch.messages or batch.already_committed:
            self._run(ack_all())

    def lag(self) -> Lag:
        info = self._consumer_info()
        if info is None:  # no consumer yet: every message of the stream on the subject waits
            stream = self._run(self._connect().stream_info(self.config.stream, subjects_filter=self.config.subject))
            waiting = sum((stream.state.subjects or {}).values())
            return Lag(waiting, 0, {"consumer": "(not created yet)"})
        return Lag(int(info.num_pending or 0), int(info.num_ack_pending or 0),
                   {"ack_floor": int(info.ack_floor.stream_seq), "delivered": int(info.delivered.stream_seq)})

    def next_position(self) -> str | None:
        info = self._consumer_info()
        if info is None:
            stream = self._run(self._connect().stream_info(self.config.stream, subjects_filter=self.config.subject))
            return str(stream.state.first_seq) if sum((stream.state.subjects or {}).values()) else None
        if not (info.num_pending or info.num_ack_pending):
            return None
        return str(int(info.ack_floor.stream_seq) + 1)

    def close(self) -> None:
        if self._nc is not None:
            self._run(self._nc.close())
            self._nc = self._js = None
        self._loop.close()


def _before_partial_end(fetched: list[Message], view: LedgerView) -> bool:
    """A partially committed batch is rebuilt whole: keep fetching until its last message came."""
    if view.partial is None:
        return False
    return not fetched or max(int(m.position) for m in fetched) < view.partial[1]
