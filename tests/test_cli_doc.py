"""docs/cli.md names only commands, options and environment variables that ``prompt-outbox``
has, and names every command and every option of ``serve``, so the reference cannot drift
from the code silently."""

from __future__ import annotations

import re
from pathlib import Path

import click

from prompt_outbox.cli import main

DOC = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text()


def _commands(group: click.Group, prefix: str = "") -> dict[str, click.Command]:
    """Every command by its full name (``tokens add`` too)."""
    found: dict[str, click.Command] = {}
    for name, command in group.commands.items():
        found[prefix + name] = command
        if isinstance(command, click.Group):
            found.update(_commands(command, f"{prefix}{name} "))
    return found


COMMANDS = _commands(main)


def _options(command: click.Command, *, negations: bool = True) -> set[str]:
    """The command's options; with ``negations``, a flag's ``--no-...`` form too."""
    return {
        o
        for p in command.params
        for o in (*p.opts, *(p.secondary_opts if negations else ()))
        if o.startswith("-")
    }


def _envvars(command: click.Command) -> set[str]:
    return {p.envvar for p in command.params if isinstance(p.envvar, str)}


def test_every_command_named_in_the_doc_exists_and_every_command_is_named() -> None:
    named = set(re.findall(r"prompt-outbox ([a-z]+(?: add)?)\b", DOC))
    assert named - set(COMMANDS) == set()
    groups = {n for n, c in COMMANDS.items() if isinstance(c, click.Group)}  # named by theirs
    assert set(COMMANDS) - groups - named == set()


def test_every_option_named_in_the_doc_exists() -> None:
    every = set().union(*(_options(c) for c in COMMANDS.values())) | {"--help", "--version"}
    other_tools = DOC.replace("bench/stalled.py --case", "")  # a benchmark's flag, not ours
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", other_tools))
    assert named - every == set()


def test_every_serve_option_is_in_the_doc() -> None:
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", DOC))
    assert _options(COMMANDS["serve"], negations=False) - named - {"--help"} == set()


def test_the_serve_usage_block_lists_every_serve_option() -> None:
    # The block a reader copies from: an option only in the prose below it is easy to miss.
    block = re.search(r"### `prompt-outbox serve`\n.*?^```\n(.*?)^```", DOC, flags=re.S | re.M)
    assert block is not None
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", block.group(1)))
    assert _options(COMMANDS["serve"], negations=False) - named - {"--help"} == set()


def test_every_environment_variable_named_in_the_doc_exists() -> None:
    every = set().union(*(_envvars(c) for c in COMMANDS.values()))
    named = set(re.findall(r"\bPROMPT_OUTBOX_[A-Z0-9_]+", DOC))
    # Read by the code itself, not by an option: the webhook secret's default variable.
    assert named - every - {"PROMPT_OUTBOX_WEBHOOK_SECRET"} == set()


def test_no_help_text_shows_markup() -> None:
    # click prints a command's docstring as it is: reST's ``code`` would reach the terminal.
    shown = [
        (name, text)
        for name, command in {"": main, **COMMANDS}.items()
        for text in (command.help, *(getattr(p, "help", None) for p in command.params))
        if text and "``" in text
    ]
    assert shown == []
