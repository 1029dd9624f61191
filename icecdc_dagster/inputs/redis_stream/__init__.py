"""``input: {redis_stream: {...}}``: a Redis stream read by a consumer group."""
