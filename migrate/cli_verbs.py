"""The command line's verbs, each declared at its handler: ``@verb(name, help)`` on the handler,
``@arguments(name)`` on the function that adds its arguments, right after it.

A verb is its name (``"convert"``, or ``"lora export"`` for a verb of the group ``lora``), its
one-line help, its handler (argparse's namespace -> exit code) and the function that adds its
arguments to its parser. `migrate.cli.build_parser` builds the whole command line from `VERBS`,
in declaration order; nothing patches another verb's parser. Handlers import their library inside
their function, so a command loads only what it runs (`migrate convert` never imports MindSpore).
Adding a verb is one declaration in one of the `cli*` modules (docs/DESIGN.md "Registration").
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Verb", "VERBS", "verb", "arguments", "group", "add_verbs", "trust_argument"]

Options = Callable[[argparse.ArgumentParser], None]
Handler = Callable[[argparse.Namespace], int]


@dataclass
class Verb:
    name: str                      # "convert"; "lora export": the verb "export" of the group "lora"
    help: str
    options: Options | None = None  # adds the verb's arguments to its parser
    run: Handler | None = None     # None: a group, whose verbs are the command's next word
    dest: str | None = None        # a group: the namespace attribute naming the verb chosen


VERBS: dict[str, Verb] = {}        # name -> verb, in declaration order


def _declare(v: Verb) -> None:
    parent = v.name.rpartition(" ")[0]
    if parent and (parent not in VERBS or VERBS[parent].run is not None):
        raise ValueError(f"verb {v.name!r}: declare its group {parent!r} first (group({parent!r}, ...))")
    old = VERBS.get(v.name)
    if old is not None and old.run is not None and v.run is not None and old.run.__qualname__ != v.run.__qualname__:
        raise ValueError(f"verb {v.name!r} declared twice ({old.run.__qualname__}, {v.run.__qualname__})")
    if old is not None and old.run is not None and v.run is not None:
        v.options = old.options   # the same module loaded again (python -m migrate.cli): its arguments follow
    VERBS[v.name] = v


def verb(name: str, help: str):
    """Declare the decorated function as the handler of verb ``name``."""
    def register(run: Handler) -> Handler:
        _declare(Verb(name, help, run=run))
        return run
    return register


def arguments(name: str):
    """Declare the decorated function (parser -> None) as what adds verb ``name``'s arguments."""
    def register(options: Options) -> Options:
        v = VERBS.get(name)
        if v is None or v.run is None:
            raise ValueError(f"arguments for {name!r}: declare the verb first (@verb({name!r}, ...))")
        v.options = options
        return options
    return register


def group(name: str, help: str, dest: str) -> None:
    """Declare a verb whose own verbs follow it (``migrate lora export``); ``dest`` names the one chosen."""
    _declare(Verb(name, help, dest=dest))


def add_verbs(sub: argparse._SubParsersAction) -> None:
    """Every declared verb as a subparser of ``sub`` (groups' verbs under theirs)."""
    subs = {"": sub}
    for v in VERBS.values():
        parent, _, word = v.name.rpartition(" ")
        p = subs[parent].add_parser(word, help=v.help)
        if v.run is None:
            subs[v.name] = p.add_subparsers(dest=v.dest, required=True)
            continue
        if v.options is not None:
            v.options(p)
        p.set_defaults(func=v.run)


def trust_argument(p: argparse.ArgumentParser) -> None:
    """`--trust-model-class`: a plain flag (args.trust_model_class), which `migrate.cli.main` also sets
    when MIGRATE_TRUST_MODEL_CLASS=1; the verb's handler passes it as ``trust=``."""
    p.add_argument("--trust-model-class", action="store_true",
                   help="import a model class that migrate does not bundle (model.yaml `model_class`, "
                        "keymap `target`); only for folders and keymaps you trust")
