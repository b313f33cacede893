"""Every control command documents its arguments and its JSON reply, and the role table names exactly them."""

from __future__ import annotations

import inspect

import pytest

from profwatch.coordinator_control import ControlCommands
from profwatch.core.access import COMMAND_ROLES

COMMANDS = sorted(name.removeprefix("_cmd_") for name in vars(ControlCommands) if name.startswith("_cmd_"))


def test_the_role_table_names_every_handler() -> None:
    assert COMMANDS == sorted(COMMAND_ROLES)


@pytest.mark.parametrize("cmd", COMMANDS)
def test_a_control_command_gives_its_args_and_reply(cmd: str) -> None:
    handler = getattr(ControlCommands, f"_cmd_{cmd}")
    doc = inspect.getdoc(handler) or ""
    assert "Args:" in doc and "Reply:" in doc, f"{cmd}: docstring needs Args: and Reply: sections"
    args_part = doc.split("Args:", 1)[1].split("Reply:", 1)[0]
    params = [p for p in inspect.signature(handler).parameters if p != "self"]
    if not params:
        assert args_part.strip().startswith("none"), f"{cmd}: say 'Args: none.'"
    for p in params:
        assert p in args_part, f"{cmd}: argument {p!r} is not described under Args:"
    assert doc.split("Reply:", 1)[1].strip(), f"{cmd}: empty Reply:"
