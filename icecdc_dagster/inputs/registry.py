"""The input kinds: YAML key -> config class (adding a kind is one line here)."""

from icecdc_dagster.inputs.base import InputConfig
from icecdc_dagster.inputs.landing.config import LandingConfig
from icecdc_dagster.inputs.nats_jetstream.config import NatsJetStreamConfig
from icecdc_dagster.inputs.redis_stream.config import RedisStreamConfig

INPUT_KINDS: dict[str, type[InputConfig]] = {c.kind: c for c in (LandingConfig, NatsJetStreamConfig, RedisStreamConfig)}
