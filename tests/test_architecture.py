"""The package's layering, read from its import statements (docs/DESIGN.md "Layers").

Lower layers never import higher ones, at top level or inside a function; the
import graph has no loop; and a module imports one of the package's own modules
inside a function only to keep a heavy framework (MindSpore, torch, transformers,
matplotlib) out of a light path -- `migrate convert` never loads MindSpore -- never
to dodge a loop.
"""
import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "migrate"

# Lowest first. A module takes the layer of the longest prefix listed.
LAYERS = [
    ("foundation", ["migrate", "migrate.errors", "migrate.safeyaml", "migrate.jsonsafe", "migrate.dtype_names",
                    "migrate.signals", "migrate.ui", "migrate.resources", "migrate.byte_sizes",
                    "migrate.native", "migrate.collector"]),
    ("files", ["migrate.checkpoints", "migrate.transforms", "migrate.hf_config", "migrate.hf_loading",
               "migrate.sidecar", "migrate.data", "migrate.parallel.layout"]),
    # The run protocol: the step record, the checkpoint state keys, the cadence both trainers
    # follow and `migrate compare` reads (framework-free).
    ("run protocol", ["migrate.run_protocol"]),
    ("model descriptions", ["migrate.keymap", "migrate.keymap_schema", "migrate.models.conversion_plan",
                            "migrate.models.config", "migrate.models.gpt2_config", "migrate.models.bert_config",
                            "migrate.models.registry", "migrate.models.shapes", "migrate.models.support",
                            "migrate.models.rope", "migrate.models.anatomy", "migrate.lora"]),
    ("conversion", ["migrate.convert", "migrate.export", "migrate.inspect_ckpt", "migrate.keymap_check",
                    "migrate.memory_plan", "migrate.lora.transfer", "migrate.lora.memory", "migrate.vocab",
                    "migrate.hf_model_config"]),
    ("MindSpore models", ["migrate.models", "migrate.lora.cells"]),  # lora.cells: the adapter as MindSpore cells
    ("judge", ["migrate.judge", "migrate.compare"]),  # compare: the curve judge for `migrate compare`
    ("tools", ["migrate.align", "migrate.parallel", "migrate.train", "migrate.mindformers", "migrate.probe",
               "migrate.state_diff",
               "migrate.infer", "migrate.replay"]),
    # Processes of their own: the command line, the demo, msrun's worker, the memory probe the
    # planner runs in a clean interpreter (its lazy imports are what it measures).
    ("entry points", ["migrate.cli", "migrate.cli_verbs", "migrate.cli_args", "migrate.cli_train", "migrate.cli_lora",
                      "migrate.cli_mindformers",
                      "migrate.cli_infer",
                      "migrate.cli_probe",
                      "migrate.cli_health", "migrate.cli_vocab", "migrate.cli_report",
                      "migrate.demo", "migrate.demo_train",
                      "migrate.__main__", "migrate.train.launch.worker", "migrate.memory_plan_measure"]),
]
ENTRY = "entry points"  # the command line loads only what the chosen command needs
HEAVY = {"mindspore", "torch", "transformers", "matplotlib", "peft", "tokenizers"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> int:
    best, rank = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if prefix == "migrate" and module != prefix:
                continue  # the package root names itself only: a new subpackage must be placed
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    assert rank is not None, f"{module} has no layer in tests/test_architecture.py"
    return rank


def imports(path: Path, known: set[str]):
    """(imported module, inside a function?) for every import: the package's own modules by
    their module name, others by their top-level name."""
    tree = ast.parse(path.read_text(), str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        inside, typing_only, p = False, False, parents.get(node)
        while p is not None:
            if isinstance(p, ast.If) and "TYPE_CHECKING" in ast.unparse(p.test):
                typing_only = True  # never runs
            if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inside = True
            p = parents.get(p)
        if typing_only:
            continue
        for name in names:
            if not name.startswith("migrate"):
                yield name.split(".")[0], inside
                continue
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != here and not here.startswith(name + "."):
                yield name, inside


@pytest.fixture(scope="module")
def graph():
    paths = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    known = set(paths)
    every = {mod: list(imports(path, known)) for mod, path in paths.items()}
    return {mod: [(b, inside) for b, inside in edges if b in known] for mod, edges in every.items()}, every


def own(graph):
    return graph[0]


def heavy_modules(graph) -> set[str]:
    """Modules that load a heavy framework when imported (top-level imports, transitively)."""
    every = graph[1]
    heavy = {m for m, edges in every.items() if any(b in HEAVY and not inside for b, inside in edges)}
    grew = True
    while grew:
        more = {m for m, edges in every.items() if m not in heavy and any(b in heavy and not inside
                                                                          for b, inside in edges)}
        heavy |= more
        grew = bool(more)
    return heavy


def test_every_module_has_a_layer(graph):
    for module in own(graph):
        layer_of(module)


def test_no_module_imports_a_higher_layer(graph):
    upward = [f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
              for a, edges in own(graph).items() for b, _ in edges if layer_of(b) > layer_of(a)]
    assert not upward, "\n".join(upward)


def test_the_import_graph_has_no_loop(graph):
    edges = {a: {b for b, _ in e} for a, e in own(graph).items()}
    state: dict[str, int] = {}
    loops = []

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                loops.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert not loops, "\n".join(loops)


def test_imports_inside_functions_only_keep_heavy_frameworks_out(graph):
    """A function-level import of our own module is there to defer a framework the importing
    module does not load by itself; any other belongs at the top of the file."""
    heavy = heavy_modules(graph)
    hidden = sorted({f"{a} imports {b} inside a function" for a, edges in own(graph).items()
                     for b, inside in edges
                     if inside and (b not in heavy or a in heavy) and LAYERS[layer_of(a)][0] != ENTRY})
    assert not hidden, "\n".join(hidden)
