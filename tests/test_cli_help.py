"""``--help`` reads as prose: a command's summary on one line of the command list (not broken where its docstring
broke), and flags without a ``<bool>`` type (they take no value)."""

from __future__ import annotations

import re

import click
import pytest
from typer.main import get_command
from typer.testing import CliRunner

from dufs.cli import app

GROUP = get_command(app)
COMMANDS = sorted(GROUP.list_commands(click.Context(GROUP)))
WIDE = {"COLUMNS": "400"}  # no line is broken for the terminal's width: any break left is in the text


def _help(*args: str) -> str:
    res = CliRunner().invoke(app, [*args, "--help"], env=WIDE)
    assert res.exit_code == 0, res.output
    return res.stdout


def test_the_command_list_has_one_line_a_command():
    text = _help()
    panel = text[text.index("Commands"):]
    rows = [line.strip("│ ").strip() for line in panel.splitlines()[1:] if line.startswith("│")]
    assert [r.split()[0] for r in rows] == [c for c in GROUP.list_commands(click.Context(GROUP))]
    for r in rows:  # the summary is whole sentences
        assert r.endswith((".", ")")), r


@pytest.mark.parametrize("cmd", [None, *COMMANDS])
def test_flags_show_no_bool_type(cmd):
    text = _help(*([cmd] if cmd else []))
    assert "<bool>" not in text
    assert re.search(r"--help\s+Show this message and exit\.", text)
