"""The Kafka wire protocol listener (see server.py)."""
