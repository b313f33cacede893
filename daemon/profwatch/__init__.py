"""profwatch daemons: node relay, coordinator, CLI (import name ``profwatch``, in the source root ``daemon/`` so that it
never collides with python-daemon's ``daemon``; ``docs/architecture.md#layout-where-each-concern-lives``)."""

__version__ = "0.1.0"
