"""YAML from files a user may have been handed (keymaps, model.yaml): bounded, and
quoted back in errors without ever echoing an unbounded value.

PyYAML's SafeLoader already refuses `!!python/...` tags, but an alias is a
reference, not a copy: ten anchors of ten aliases each compose to a few hundred
nodes that *mean* 10^10 values, and whatever walks or prints the loaded data
(a merge, a repr in an error message) pays for every one of them. So the composed
document's expanded size is counted (each alias as the whole subtree it names)
and refused beyond `MAX_NODES` before any Python object is built.
"""
from __future__ import annotations

import reprlib
from pathlib import Path
from typing import Any

import yaml

from migrate.errors import MigrateError

MAX_NODES = 100_000      # expanded nodes per document; the bundled keymaps hold a few hundred
MAX_DEPTH = 100          # nesting of sequences and mappings, as migrate.jsonsafe bounds JSON
MAX_BYTES = 16 << 20     # a keymap, model.yaml or run.yaml is a few KB: a file past this is not one
QUOTE_LIMIT = 200        # characters of a value quoted in an error message

_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxdict, _repr.maxlist, _repr.maxtuple, _repr.maxset = 3, 6, 6, 6, 6
_repr.maxstring, _repr.maxother, _repr.maxlong = QUOTE_LIMIT, QUOTE_LIMIT, 40


def clip(text: str, limit: int = QUOTE_LIMIT) -> str:
    """`text` on one line, at most `limit` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def quote(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """repr(value) for an error message: bounded in length and in work, whatever the
    value (reprlib stops descending after a few levels and items)."""
    return clip(_repr.repr(value), limit)


class _BoundedLoader(yaml.SafeLoader):
    def compose_document(self):
        node = super().compose_document()
        _check_expansion(node)
        return node


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _check_expansion(root: yaml.Node) -> None:
    """Expanded node count of the composed graph (a shared node counts once per reference) and
    its expanded nesting depth (MAX_DEPTH), iteratively so that depth cannot exhaust the stack; a
    cycle (an alias inside its own anchor) is refused. A shared node is walked once, so its size and
    its height (levels below it, aliases expanded) are kept: an alias adds them where it stands, and a
    deep anchor reused under a deep alias is as deep as the document it expands to."""
    size: dict[int, int] = {}
    height: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool, int]] = [(root, False, 1)]
    while stack:
        node, done, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise _TooDeep()
        key = id(node)
        if done:
            on_path.discard(key)
            children = _children(node)
            size[key] = 1 + sum(size[id(child)] for child in children)
            height[key] = 1 + max((height[id(child)] for child in children), default=0)
            if size[key] > MAX_NODES:
                raise _TooLarge()
            if depth - 1 + height[key] > MAX_DEPTH:   # this node's depth plus what its aliases expand to
                raise _TooDeep()
            continue
        if key in size:
            continue
        if key in on_path:
            raise yaml.YAMLError("an alias refers to its own anchor (a recursive structure)")
        on_path.add(key)
        _check_unique_keys(node)
        stack.append((node, True, depth))
        stack.extend((child, False, depth + 1) for child in _children(node) if id(child) not in size)


def _check_unique_keys(node: yaml.Node) -> None:
    """A mapping naming one key twice is refused: PyYAML keeps the last silently (`total_steps: 4` then
    `total_steps: 9` further down trained 9). A merge key (`<<`) may repeat."""
    if not isinstance(node, yaml.MappingNode):
        return
    seen = set()
    for key, _ in node.value:
        if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
            continue
        if key.value in seen:
            raise yaml.MarkedYAMLError(problem=f"key {clip(key.value, 80)!r} appears twice in one mapping",
                                       problem_mark=key.start_mark)
        seen.add(key.value)


class _TooLarge(yaml.YAMLError):
    pass


class _TooDeep(yaml.YAMLError):
    pass


def yaml_error(exc: BaseException) -> str:
    """One line for a YAML error: the problem and where (line, column)."""
    if isinstance(exc, _TooLarge):
        return f"expands to more than {MAX_NODES:,} values (anchors and aliases); refused"
    if isinstance(exc, _TooDeep):
        return f"nested more than {MAX_DEPTH} levels deep; refused"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if isinstance(exc, yaml.MarkedYAMLError):
        parts = [p for p in (exc.context, exc.problem) if p]
        mark = exc.problem_mark or exc.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        return clip(", ".join(parts) or type(exc).__name__) + where
    return clip(str(exc) or type(exc).__name__)


def load_yaml(path: str | Path, what: str) -> Any:
    """The one document of YAML file `path`, or MigrateError in one line naming `what`
    (e.g. "keymap", "model config") and the file."""
    path = Path(path)
    try:
        if path.exists() and not path.is_file():  # open() of a FIFO blocks until a writer comes: refuse first
            raise MigrateError(f"cannot read {what} {path}: not a regular file")
        with open(path, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)  # bounded on the open file: a growing file cannot run past it
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise MigrateError(f"cannot read {what} {path}: {clip(getattr(exc, 'strerror', None) or exc)}") from None
    if len(raw) > MAX_BYTES:
        raise MigrateError(f"invalid {what} {path}: larger than {MAX_BYTES >> 20} MiB; refused")
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 -- a SafeLoader subclass
    except (yaml.YAMLError, RecursionError) as exc:
        raise MigrateError(f"invalid {what} {path}: {yaml_error(exc)}") from None
