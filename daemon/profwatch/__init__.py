"""profwatch daemons: node relay, coordinator, CLI (import name ``daemon``; not python-daemon)."""

__version__ = "0.1.0"
