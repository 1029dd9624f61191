"""The machine's real brokers for tests: a unique JetStream stream / Redis stream key per test, deleted after."""

import asyncio
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

NATS_URL = "nats://127.0.0.1:4222"
REDIS_URL = "redis://127.0.0.1:6379/0"


def _unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


async def _nats(action):  # noqa: ANN001, ANN202 - a test helper
    import nats

    nc = await nats.connect(NATS_URL)
    try:
        return await action(nc.jetstream())
    finally:
        await nc.close()


@contextmanager
def jetstream_subject() -> Iterator[tuple[str, str]]:
    """(stream, subject): a fresh stream holding one subject; deleted after the test."""
    stream, subject = _unique("ICECDC_T_"), _unique("icecdc.test.")

    async def create(js):  # noqa: ANN001, ANN202
        await js.add_stream(name=stream, subjects=[subject])

    async def delete(js):  # noqa: ANN001, ANN202
        await js.delete_stream(stream)

    asyncio.run(_nats(create))
    try:
        yield stream, subject
    finally:
        asyncio.run(_nats(delete))


def publish_nats(subject: str, payloads: Sequence[bytes]) -> list[int]:
    """Publish in order; returns the stream sequences JetStream acknowledged."""
    async def pub(js):  # noqa: ANN001, ANN202
        return [(await js.publish(subject, p)).seq for p in payloads]

    return asyncio.run(_nats(pub))


@contextmanager
def redis_stream() -> Iterator[str]:
    """A fresh stream key; deleted after the test."""
    import redis

    key = _unique("icecdc:test:")
    client = redis.Redis.from_url(REDIS_URL)
    try:
        yield key
    finally:
        client.delete(key)
        client.close()


def publish_redis(key: str, payloads: Sequence[bytes], field: bytes = b"key") -> list[str]:
    """XADD in order, one field per entry like Debezium Server's compact format; returns the entry ids."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        return [client.xadd(key, {field: p}).decode() for p in payloads]
    finally:
        client.close()
