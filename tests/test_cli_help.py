"""Every command's ``--help`` is plain text: docstrings of the package use Sphinx markup (double
backticks, ``:func:`` roles), which click prints as it is; a command's help must not."""

from __future__ import annotations

import re
import subprocess
import sys

import click
import pytest

from mlflow_rag_eval.cli import main

#: what a terminal would show as markup rather than text
MARKUP = {
    "a backtick": re.compile(r"`"),
    "a Sphinx role": re.compile(r":(func|class|meth|mod|attr|exc|data|obj|ref):"),
    "RST bold": re.compile(r"\*\*\S"),
    "an RST literal-block marker": re.compile(r"\S::\s*$", re.MULTILINE),
}


def _commands(command: click.Command, path: tuple[str, ...]):
    yield path, command
    if isinstance(command, click.Group):
        ctx = click.Context(command, info_name=path[-1])
        for name in command.list_commands(ctx):
            yield from _commands(command.get_command(ctx, name), (*path, name))


COMMANDS = dict(_commands(main, ("mlflow-rag-eval",)))


def _help(path: tuple[str, ...], command: click.Command) -> str:
    return command.get_help(click.Context(command, info_name=" ".join(path)))


def test_every_command_is_walked():
    names = {" ".join(p) for p in COMMANDS}
    assert {"mlflow-rag-eval evaluate", "mlflow-rag-eval gate", "mlflow-rag-eval cache info"} <= names
    assert len(names) >= 12, sorted(names)


@pytest.mark.parametrize("path", list(COMMANDS), ids=" ".join)
def test_help_is_plain_text(path):
    text = _help(path, COMMANDS[path])
    assert text.startswith("Usage: " + " ".join(path)), text
    found = {what: pattern.findall(text) for what, pattern in MARKUP.items() if pattern.search(text)}
    assert not found, f"{' '.join(path)} --help shows markup {found}:\n{text}"


def test_evaluate_help_from_the_installed_command():
    """What a user types: the console script's own output, not click's in-process rendering."""
    done = subprocess.run([sys.executable, "-c", "from mlflow_rag_eval.cli import main; main()", "evaluate",
                           "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Usage: " in done.stdout and "--data" in done.stdout
    assert "`" not in done.stdout and ":func:" not in done.stdout, done.stdout
