"""docs/DESIGN.md "Registration": the command line is built from the verbs declared at their handlers."""
import argparse

import pytest

from migrate import cli_verbs
from migrate.cli import build_parser, main
from migrate.cli_verbs import VERBS, arguments, group, verb


def _choices(parser):
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_every_verb_comes_from_its_declaration():
    parser = build_parser()
    top = _choices(parser)
    assert list(top) == [name for name in VERBS if " " not in name]
    for name, v in VERBS.items():
        words = name.split()
        p = top[words[0]]
        for word in words[1:]:
            p = _choices(p)[word]
        assert p.get_default("func") is v.run, name


def test_a_verb_is_one_declaration(monkeypatch, capsys):
    monkeypatch.setattr(cli_verbs, "VERBS", dict(VERBS))   # undone after the test
    group("demo-group", "a group", dest="demo_command")

    @verb("demo-group hello", "say hello")
    def _hello(args) -> int:
        print(f"hello {args.who}")
        return 0

    @arguments("demo-group hello")
    def _hello_arguments(p) -> None:
        p.add_argument("who")

    assert main(["demo-group", "hello", "world"]) == 0
    assert capsys.readouterr().out == "hello world\n"
    with pytest.raises(ValueError, match="declare its group"):
        verb("nowhere hello", "no group")(_hello)

