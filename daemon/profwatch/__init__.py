"""profwatch daemons: node relay, coordinator, CLI (import name ``profwatch``, in the source root ``daemon/`` so that it
never collides with python-daemon's ``daemon``; ``docs/architecture.md#layout-where-each-concern-lives``).

``__version__`` is looked up on first use (``rankhook/version.py``: the distribution's metadata, or the source
tree's ``pyproject.toml``), so ``import profwatch`` stays standard library only.
"""

from __future__ import annotations


def __getattr__(name: str) -> str:
    if name == "__version__":
        from rankhook.version import distribution_version

        version = distribution_version(__file__, 2)
        globals()["__version__"] = version
        return version
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
