"""The Kafka front end: the wire protocol listener (server.py), the protocol framing, the record
batch codec (records.py), the group coordinator and the handlers. Never imports the HTTP front end."""
