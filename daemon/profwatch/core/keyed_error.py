"""A configuration rule that spans several keys names every key it involves (``KeysError``), so that
``profwatch config check`` and a daemon's start-up error list ``coordinator.metrics_tls_cert,
coordinator.metrics_tls_key: ...`` instead of the section alone (``daemon/profwatch/config.py`` formats it)."""

from __future__ import annotations


class KeysError(ValueError):
    """A cross-key rule broken: ``keys`` are the offending settings, relative to the model that raised it
    (``("metrics_tls_cert", "metrics_tls_key")``; dotted for the root model), ``message`` says why and the fix.
    A ``ValueError``, so pydantic reports it as a validation error of that model (its ``ctx["error"]``)."""

    def __init__(self, keys: tuple[str, ...] | list[str], message: str) -> None:
        super().__init__(message)
        self.keys = tuple(keys)
        self.message = message
