"""The input kinds: YAML key -> config class, and the reader each config opens (adding a kind is one line
here). The registry builds the reader so that a kind's ``config.py`` need not import its ``reader.py``: the
reader imports its config, never the other way round."""

from collections.abc import Callable
from typing import Any

from icecdc_dagster.inputs.base import InputConfig, StreamInput
from icecdc_dagster.inputs.landing.config import LandingConfig
from icecdc_dagster.inputs.landing.reader import LandingInput
from icecdc_dagster.inputs.nats_jetstream.config import NatsJetStreamConfig
from icecdc_dagster.inputs.nats_jetstream.reader import NatsJetStreamInput
from icecdc_dagster.inputs.redis_stream.config import RedisStreamConfig
from icecdc_dagster.inputs.redis_stream.reader import RedisStreamInput

_KINDS: tuple[tuple[type[InputConfig], Callable[[Any], StreamInput]], ...] = (
    (LandingConfig, LandingInput),
    (NatsJetStreamConfig, NatsJetStreamInput),
    (RedisStreamConfig, RedisStreamInput),
)
INPUT_KINDS: dict[str, type[InputConfig]] = {config.kind: config for config, _ in _KINDS}
_READERS: dict[type[InputConfig], Callable[[Any], StreamInput]] = dict(_KINDS)


def open_input(config: InputConfig) -> StreamInput:
    """The reader of ``config`` (a context manager: ``with open_input(entry.input) as reader``).

    Raises:
        StreamInputError: a broker input that cannot connect (raised by the reader on first use).
    """
    return _READERS[type(config)](config)
