"""The ``redis_stream`` input's settings (validated at load like the rest of the pipeline file)."""

from typing import ClassVar

from pydantic import Field

from icecdc_dagster.fields import Duration, EnvOrText, NonNegativeInt, Secret, parse_duration
from icecdc_dagster.inputs.base import BrokerInputConfig


class RedisStreamConfig(BrokerInputConfig):
    """Debezium events from a Redis stream (Debezium Server's ``redis`` sink), read by a consumer group; the
    entry-id range of each batch is its id in the Iceberg commit, ``XACK`` follows the commit."""

    kind: ClassVar[str] = "redis_stream"

    url: str = Field(default="redis://127.0.0.1:6379/0", pattern=r"^rediss?://", description="server URL")
    key: str = Field(min_length=1, description="stream key (Debezium: the topic name)")
    group: str = Field(default="icecdc", min_length=1, description="consumer group (created at the stream's "
                                                                     "first entry when missing)")
    consumer: str = Field(default="icecdc", min_length=1, description="this reader's consumer name in the group")
    username: EnvOrText | None = Field(default=None, description="ACL user (plain or {env: VARIABLE})")
    password: Secret | None = Field(default=None, description="{env: VARIABLE}")
    claim_min_idle: Duration = Field(
        default="PT0S", description="pending entries of other consumers idle this long are claimed (XAUTOCLAIM); "
                                    "the line has one writer, so any other consumer's entries are a dead run's")
    block: Duration = Field(default="PT1S", description="how long a read waits for new entries")
    null_value: str = Field(default="default", description="the value Debezium Server writes for a tombstone "
                                                           "(debezium.sink.redis.null.value)")
    database: NonNegativeInt | None = Field(default=None, description="database number (default: the URL's)")

    @property
    def source(self) -> str:
        return f"redis-stream://{self.key}"

    @property
    def claim_min_idle_ms(self) -> int:
        return int(parse_duration(self.claim_min_idle) * 1000)

    @property
    def block_ms(self) -> int:
        return int(parse_duration(self.block) * 1000)

    def describe(self) -> str:
        return f"Redis stream {self.key} (group {self.group}, consumer {self.consumer} at {self.url})"
