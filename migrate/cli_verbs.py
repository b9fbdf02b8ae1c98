"""The command line's verbs, each declared at its handler: ``@verb(name, help)`` on the handler,
``@arguments(name)`` on the function that adds its arguments, right after it.

A verb is its name (``"convert"``, or ``"lora export"`` for a verb of the group ``lora``), its
one-line help, its handler (argparse's namespace -> exit code) and the function that adds its
arguments to its parser. `migrate.cli.build_parser` builds the whole command line from `VERBS`,
in declaration order; nothing patches another verb's parser. Handlers import their library inside
their function, so a command loads only what it runs (`migrate convert` never imports MindSpore).
Adding a verb is one declaration in one of the `cli*` modules (docs/DESIGN.md "Registration").

A verb that writes declares it there: ``@verb(name, help, writes=(Output("out_dir"), ...),
reads=("src_dir", ...))``. `migrate.cli.main` checks every declared output against every declared
input (`guard_outputs`, the rule in `migrate.checkpoints.output_guard`) before the handler runs,
so a refusal comes before any model loads and before any output is written.
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["Verb", "VERBS", "Output", "verb", "arguments", "group", "add_verbs", "trust_argument",
           "guard_outputs"]

Options = Callable[[argparse.ArgumentParser], None]
Handler = Callable[[argparse.Namespace], int]
Paths = Callable[[argparse.Namespace], Iterable[Any]]


@dataclass(frozen=True)
class Output:
    """One output of a verb: the argparse destination naming it (or `value`, args -> path or None,
    for one that is part of another argument, e.g. --hf's HF_OUT), a folder or a single file, and
    the destination of the --overwrite flag that lets it be replaced (None: the verb has none; a
    folder is then only checked against the inputs, a file is replaced as migrate regenerates it)."""
    dest: str
    kind: str = "dir"                       # "dir" | "file"
    overwrite: str | None = "overwrite"
    value: Callable[[argparse.Namespace], Any] | None = None
    first_line: str | None = None           # a file: replace only one whose first line starts so
    signature: bytes | None = None          # a file: replace only one whose first KiBs hold this
    exempt: Callable[[argparse.Namespace], Any] | None = None  # args -> the verb's own default path

    def path(self, args: argparse.Namespace) -> Any:
        return self.value(args) if self.value is not None else getattr(args, self.dest, None)


@dataclass
class Verb:
    name: str                      # "convert"; "lora export": the verb "export" of the group "lora"
    help: str
    options: Options | None = None  # adds the verb's arguments to its parser
    run: Handler | None = None     # None: a group, whose verbs are the command's next word
    dest: str | None = None        # a group: the namespace attribute naming the verb chosen
    writes: tuple[Output, ...] = ()  # what the verb writes (checked before it runs)
    reads: tuple[str | Paths, ...] = ()  # argparse destinations, or args -> paths, the verb reads


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


def verb(name: str, help: str, *, writes: Iterable[Output] = (), reads: Iterable[str | Paths] = ()):
    """Declare the decorated function as the handler of verb ``name``; ``writes``: its outputs,
    ``reads``: every path it reads (the outputs may not be, hold or lie inside one)."""
    def register(run: Handler) -> Handler:
        _declare(Verb(name, help, run=run, writes=tuple(writes), reads=tuple(reads)))
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
        p.set_defaults(func=v.run, migrate_verb=v.name)


def _flat(value: Any) -> list:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [x for item in value for x in _flat(item)]
    return [value]


def guard_outputs(args: argparse.Namespace) -> None:
    """Check every output the chosen verb declares, all of them before it writes any (one line each)."""
    from pathlib import Path

    from migrate.checkpoints.output_guard import check_apart, check_file_output, check_output

    v = VERBS.get(getattr(args, "migrate_verb", None) or "")
    if v is None or not v.writes:
        return
    given = [(o, o.path(args)) for o in v.writes]
    given = [(o, path) for o, path in given if path is not None]
    if not given:
        return
    inputs = [x for r in v.reads for x in _flat(r(args) if callable(r) else getattr(args, r, None))]
    for o, path in given:
        if o.exempt is not None and _same(path, o.exempt(args)):
            continue  # the verb's own default file (e.g. RUN/report.html), named explicitly
        overwrite = bool(getattr(args, o.overwrite, False)) if o.overwrite else None
        if o.kind == "file":
            check_file_output(path, overwrite=overwrite, inputs=inputs, first_line=o.first_line,
                              signature=o.signature)
            continue
        check_apart(Path(path), inputs)
        if overwrite is not None:
            check_output(path, overwrite=overwrite)


def _same(path: Any, other: Any) -> bool:
    return other is not None and os.path.realpath(path) == os.path.realpath(other)


def trust_argument(p: argparse.ArgumentParser) -> None:
    """`--trust-model-class`: a plain flag (args.trust_model_class), which `migrate.cli.main` also sets
    when MIGRATE_TRUST_MODEL_CLASS=1; the verb's handler passes it as ``trust=``."""
    p.add_argument("--trust-model-class", action="store_true",
                   help="import a model class that migrate does not bundle (model.yaml `model_class`, "
                        "keymap `target`); only for folders and keymaps you trust")
