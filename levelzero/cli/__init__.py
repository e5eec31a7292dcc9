"""The command line: `levelzero run` wires the daemon; every other command is a client of the
HTTP API (`client.py`)."""
