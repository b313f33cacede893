"""Every configuration error in one run (pure apart from what the settings sources read: the TOML file, the
environment): pydantic runs a model's ``after`` validators (the cross-key rules of ``daemon/profwatch/config.py``)
only when every field of that model is valid, and the root's only when every section is, so a file with one bad
value listed its cross-key errors only after that value was fixed. :func:`cross_key_lines` validates again with
the keys that failed left out (each falls back to its default) and keeps the cross-key errors that involve none of
them; a rule that only a left-out key's default would break is never reported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pydantic import ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from profwatch.core.keyed_error import KeysError

Key = tuple[str, ...]
MAX_PASSES = 4
"""Validations after the first: each leaves out what the one before refused (bounded: the sections nest twice)."""


def error_keys(err: Mapping[str, Any]) -> tuple[list[Key], bool]:
    """The full keys one pydantic error is about, and whether it is a cross-key rule (a :class:`KeysError`,
    whose keys are relative to the model that raised it; dotted for the root model)."""
    loc = tuple(str(x) for x in err.get("loc", ()))
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, KeysError):
        return [loc + tuple(k.split(".")) for k in cause.keys], True
    return [loc], False


def _drop(data: Any, keys: Iterable[Key]) -> Any:
    """``data`` (a source's nested dict) without ``keys`` (a copy; a key it does not hold is ignored)."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    nested: dict[str, list[Key]] = {}
    for k in keys:
        if len(k) == 1:
            out.pop(k[0], None)
        elif k:
            nested.setdefault(k[0], []).append(k[1:])
    for head, rest in nested.items():
        if head in out:
            out[head] = _drop(out[head], rest)
    return out


class _Without(PydanticBaseSettingsSource):
    """A settings source without the keys a first validation refused."""

    def __init__(self, settings_cls: type[BaseSettings], inner: PydanticBaseSettingsSource, keys: set[Key]) -> None:
        super().__init__(settings_cls)
        self.inner, self.keys = inner, keys

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover - unused
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_drop(self.inner(), self.keys))


def _settings_without(root: type[BaseSettings], keys: set[Key]) -> type[BaseSettings]:
    """A subclass of ``root`` whose every source (init, env, the TOML file) leaves ``keys`` out."""

    class _Pass(root):  # type: ignore[valid-type,misc]
        @classmethod
        def settings_customise_sources(cls, settings_cls: type[BaseSettings],
                                       init_settings: PydanticBaseSettingsSource,
                                       env_settings: PydanticBaseSettingsSource,
                                       dotenv_settings: PydanticBaseSettingsSource,
                                       file_secret_settings: PydanticBaseSettingsSource,
                                       ) -> tuple[PydanticBaseSettingsSource, ...]:
            inner = root.settings_customise_sources(settings_cls, init_settings, env_settings, dotenv_settings,
                                                    file_secret_settings)
            return tuple(_Without(settings_cls, s, keys) for s in inner)

    return _Pass


def cross_key_lines(root: type[BaseSettings], exc: ValidationError, overrides: dict[str, Any],
                    lines_of: Callable[[Any], list[str]]) -> list[str]:
    """The error lines (``lines_of``: :func:`profwatch.config.error_lines`) of cross-key rules that ``exc`` (the
    first validation of ``root``) could not run, found by validating again without the keys each validation
    refused (a field error's key, the keys a rule names: a section with a broken rule keeps the root's rules from
    running, and a root rule that refuses the input before its fields are read, ``_no_empty_paths``, keeps every
    other check from running). A line already in ``exc`` is not repeated; one that names a left-out key (or a key
    under it) is dropped."""
    known = set(lines_of(exc))
    left_out: set[Key] = set()
    out: list[str] = []
    for _ in range(MAX_PASSES):
        refused = {k for err in exc.errors() for k in error_keys(err)[0]}
        if refused <= left_out:
            break
        left_out |= refused
        try:
            _settings_without(root, left_out)(**_drop(overrides, left_out))
            break
        except ValidationError as again:
            exc = again
        for err, line in zip(exc.errors(), lines_of(exc), strict=True):
            keys, _rule = error_keys(err)
            if line not in known and not any(k[:len(d)] == d for k in keys for d in left_out):
                known.add(line)
                out.append(line)
    return out

