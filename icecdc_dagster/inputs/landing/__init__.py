"""``input: {landing: {...}}``: a directory of Debezium landing files (the top-level ``landing:`` spelling too)."""
