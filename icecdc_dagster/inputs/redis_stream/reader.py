"""A Redis stream consumer group as a :class:`StreamInput` (redis-py).

Order by entry id: entries delivered before and never acknowledged (a dead run's, claimed with
``XAUTOCLAIM``, or this consumer's own) always precede new ones (``>``), so a read takes them first and
reads new entries only when none is pending. Entries that another consumer still holds and that are not
yet idle for ``claim_min_idle`` stop the read (nothing new is read before them) and show in the lag.
"""

from collections.abc import Mapping
from typing import Any

from icecdc_dagster.errors import StreamInputError
from icecdc_dagster.inputs.base import Lag, Message, StreamBatch, StreamInput, ledger_view, split_batch
from icecdc_dagster.inputs.redis_stream.config import RedisStreamConfig


def entry_key(position: str) -> tuple[int, int]:
    millis, _, seq = position.partition("-")
    return int(millis), int(seq or 0)


class RedisStreamInput(StreamInput):
    def __init__(self, config: RedisStreamConfig) -> None:
        import redis  # redis-py: ~0.6 s; only a redis_stream input loads it

        self.config = config
        options: dict[str, Any] = {"socket_timeout": 10 + config.block_ms / 1000}
        if config.username is not None:
            options["username"] = config.username if isinstance(config.username, str) else config.username.resolve()
        if config.password is not None:
            options["password"] = config.password.resolve()
        if config.database is not None:
            options["db"] = config.database
        self._redis = redis.Redis.from_url(config.url, **options)

    @property
    def source(self) -> str:
        return self.config.source

    def position_key(self, position: str) -> tuple[int, int]:
        return entry_key(position)

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        import redis  # redis-py: ~0.6 s; only a redis_stream input loads it

        try:
            return fn(*args, **kwargs)
        except redis.ConnectionError as exc:
            raise StreamInputError(f"{self.config.describe()}: {what} failed: {exc}") from exc

    def _ensure_group(self) -> None:
        import redis  # redis-py: ~0.6 s; only a redis_stream input loads it

        try:
            self._call("XGROUP CREATE", self._redis.xgroup_create, self.config.key, self.config.group, id="0",
                       mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _claim(self) -> None:
        """Take over the idle pending entries of other (dead) consumers."""
        c = self.config
        start = "0-0"
        while True:
            reply = self._call("XAUTOCLAIM", self._redis.xautoclaim, c.key, c.group, c.consumer, c.claim_min_idle_ms,
                               start_id=start, count=c.max_messages)
            start = _text(reply[0])
            if start == "0-0":
                return

    def _entries(self, stream_id: str, block: int | None) -> list[Message]:
        c = self.config
        reply = self._call("XREADGROUP", self._redis.xreadgroup, c.group, c.consumer, {c.key: stream_id},
                           count=c.max_messages, block=block)
        out = []
        for _key, entries in reply or []:
            for entry_id, fields in entries:
                position = _text(entry_id)
                out.append(Message(position, self._value(fields or {}), position))
        return out

    def _value(self, fields: Mapping[bytes, bytes]) -> bytes:
        """The event: the entry's only field's value (``message.format=compact``) or its ``value`` field
        (``extended``); Debezium's stand-in for a null value is a tombstone."""
        value = fields.get(b"value") if len(fields) != 1 else next(iter(fields.values()))
        if value is None or value == self.config.null_value.encode():
            return b""
        return value

    def read(self, recorded: Mapping[str, bool]) -> StreamBatch:
        self._ensure_group()
        self._claim()
        view = ledger_view(self.source, recorded, entry_key)
        pending = self._entries("0", None)
        if not pending:
            held = int(self._call("XPENDING", self._redis.xpending, self.config.key, self.config.group)["pending"])
            if held:  # another consumer's entries, not idle long enough to claim: nothing may pass them
                raise StreamInputError(f"{self.config.describe()}: {held} entries are pending with another consumer "
                                       f"and not idle for {self.config.claim_min_idle} yet; they are claimed once "
                                       "they are (the batch runs again then)")
            pending = self._entries(">", self.config.block_ms or None)
        pending.sort(key=lambda m: entry_key(m.position))
        return split_batch(self.source, pending, view, entry_key)

    def acknowledge(self, batch: StreamBatch) -> None:
        ids = [m.handle for m in (*batch.already_committed, *batch.messages)]
        for i in range(0, len(ids), 1000):
            self._call("XACK", self._redis.xack, self.config.key, self.config.group, *ids[i:i + 1000])

    def lag(self) -> Lag:
        c = self.config
        groups = self._call("XINFO GROUPS", self._redis.xinfo_groups, c.key) if self._redis.exists(c.key) else []
        group = next((g for g in groups if _text(g["name"]) == c.group), None)
        if group is None:  # no group yet: every entry waits
            length = int(self._call("XLEN", self._redis.xlen, c.key))
            return Lag(length, 0, {"group": "(not created yet)"})
        lag = group.get("lag")
        if lag is None:  # Redis cannot tell (entries deleted in between): count what follows the group's position
            lag = len(self._call("XRANGE", self._redis.xrange, c.key, f"({_text(group['last-delivered-id'])}", "+"))
        return Lag(int(lag), int(group["pending"]), {"last_delivered_id": _text(group["last-delivered-id"])})

    def next_position(self) -> str | None:
        c = self.config
        if not self._redis.exists(c.key):
            return None
        groups = self._call("XINFO GROUPS", self._redis.xinfo_groups, c.key)
        group = next((g for g in groups if _text(g["name"]) == c.group), None)
        if group is not None and int(group["pending"]):
            return _text(self._call("XPENDING", self._redis.xpending, c.key, c.group)["min"])
        after = "-" if group is None else f"({_text(group['last-delivered-id'])}"
        following = self._call("XRANGE", self._redis.xrange, c.key, after, "+", count=1)
        return _text(following[0][0]) if following else None

    def close(self) -> None:
        self._redis.close()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
