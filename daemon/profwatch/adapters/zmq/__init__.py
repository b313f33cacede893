"""ZeroMQ sockets, CURVE keys and the control channel."""
