"""The HTTP front end: the JSON API's app and routes, its schema, the connection guard and the
access log. A door onto the node and the produce intake; it never imports the Kafka front end."""
