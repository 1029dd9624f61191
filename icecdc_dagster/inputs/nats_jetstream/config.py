"""The ``nats_jetstream`` input's settings (validated at load like the rest of the pipeline file)."""

from typing import ClassVar

from pydantic import Field

from icecdc_dagster.fields import Duration, EnvOrText, Secret, parse_duration
from icecdc_dagster.inputs.base import BrokerInputConfig


class NatsJetStreamConfig(BrokerInputConfig):
    """Debezium events from a JetStream stream (Debezium Server's ``nats-jetstream`` sink), read by a durable
    pull consumer; the stream sequence range of each batch is its id in the Iceberg commit."""

    kind: ClassVar[str] = "nats_jetstream"

    url: str = Field(default="nats://127.0.0.1:4222", pattern=r"^(nats|tls)://", description="server URL")
    stream: str = Field(min_length=1, pattern=r"^[^.*>\s]+$", description="JetStream stream name")
    subject: str = Field(min_length=1, description="subject filter of the consumer (Debezium: the topic name)")
    durable: str = Field(min_length=1, pattern=r"^[^.*>\s]+$", description="durable consumer name (created when "
                                                                              "missing)")
    user: EnvOrText | None = Field(default=None, description="user name (plain or {env: VARIABLE})")
    password: Secret | None = Field(default=None, description="{env: VARIABLE}")
    token: Secret | None = Field(default=None, description="auth token: {env: VARIABLE}")
    ack_wait: Duration = Field(default="PT5M", description="the broker re-delivers a message not acknowledged "
                                                           "within this time (longer than a batch takes)")
    fetch_wait: Duration = Field(default="PT1S", description="how long a read waits for more messages")

    @property
    def source(self) -> str:
        return f"nats-jetstream://{self.stream}/{self.subject}"

    @property
    def ack_wait_s(self) -> float:
        return parse_duration(self.ack_wait)

    @property
    def fetch_wait_s(self) -> float:
        return parse_duration(self.fetch_wait)

    def describe(self) -> str:
        return f"JetStream {self.stream} subject {self.subject} (consumer {self.durable} at {self.url})"
