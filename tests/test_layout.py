"""The package's dependency rules, read from the source with ``ast`` (no import runs).

Every import of a ``transformerkit`` module counts, at module level and inside functions.
Two rules:

- no import cycle between modules;
- dependencies point down: ``kernels`` < ``layers`` < ``converters`` (Hugging Face
  checkpoints <-> model options and weights, on a model they are given) < ``models`` (and
  ``config``, which reads the models' option declarations) < ``training``, ``decoding`` <
  ``api`` (the public facade) < ``cli``; the leaves (``data``, ``files``, ``backend``,
  ``special_tokens``, ``run_directory``, ``evaluation``, ``plotting``, ...) are usable by
  all and import only leaves. A module of a layer may be a leaf of its own
  (:data:`LEAF_MODULES`).

A new module must be placed in :data:`LEVELS` (or :data:`LEAVES`), which makes its place
a decision.
"""

import ast
import pathlib
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "src" / "transformerkit"

LEAVES = {"allocator", "backend", "data", "declared", "evaluation", "extras", "fastpath", "files",
          "internals", "plotting", "precisions", "run_directory", "special_tokens", "threads",
          "token_ids"}
# declarations only (plain Python, importing only ``declared``): the run config's
# ``search:`` section is a SearchOptions
LEAF_MODULES = {"transformerkit.decoding.options"}
LEVELS = {
    "kernels": 0.5,  # the PyTorch kernels under the layers' math (products, packing, casts)
    "layers": 1,
    # Hugging Face checkpoints <-> options, weights by name, tokenizers: they fill the model
    # they are given and import no model class, so the models' from_pretrained classmethods
    # call them (downward) and importing / export.huggingface build runs and folders on them
    "converters": 1.5,
    "models": 2,
    "saving": 2,  # loads .keras files of the layer and model classes
    "config": 2,  # the run config; its model section comes from models/options.py
    "training": 3,
    "decoding": 3,
    "export": 3,  # a model's weights -> a CTranslate2 model; api and serving run it
    "importing": 3,  # a Hugging Face checkpoint (folder or hub name) -> a run directory
    "api": 4,
    "serving": 4,  # the HTTP server over api.Run
    "__init__": 4,  # ``transformerkit`` itself: the facade resolving ``load`` lazily
    "cli": 5,
    "__main__": 5,  # ``python -m transformerkit`` (torchrun -m): the CLI's entry point
}

def module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def resolve(name):
    """The module an imported dotted name refers to: the longest prefix that is a module
    (``transformerkit.decoding.common.PAD_ID`` -> ``transformerkit.decoding.common``)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in MODULES:
            return candidate
    return None


def imports_of(module):
    """The ``transformerkit`` modules ``module`` imports anywhere in its source."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from .x import y
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            target = resolve(name)
            if target and target != module:
                found.add(target)
    return found


GRAPH = {module: imports_of(module) for module in MODULES}


def component(module):
    """``transformerkit.training.trainer`` -> ``training``; the package itself ->
    ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def level(module):
    name = component(module)
    return 0 if name in LEAVES or module in LEAF_MODULES else LEVELS.get(name)


def test_every_module_has_a_place_in_the_layers():
    unplaced = sorted(m for m in MODULES if level(m) is None)
    assert not unplaced, f"add these to LEVELS or LEAVES in {__file__}: {unplaced}"


def test_dependencies_point_down():
    wrong = []
    for module, targets in GRAPH.items():
        for target in targets:
            if level(module) is None:
                continue
            if level(module) == 0 and level(target) != 0:
                wrong.append(f"{module} (a leaf) imports {target}")
            elif level(target) > level(module):
                wrong.append(f"{module} ({component(module)}) imports {target} "
                             f"({component(target)}, a higher layer)")
    assert not wrong, "\n".join(sorted(wrong))


def _cycles():
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in GRAPH[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            members = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                members.append(member)
                if member == node:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for node in sorted(GRAPH):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles():
    cycles = _cycles()
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("module", ["transformerkit.special_tokens",
                                    "transformerkit.run_directory", "transformerkit.files"])
def test_small_shared_modules_import_no_third_party_package(module):
    """The modules every layer reads (special ids, file names, atomic writes) stay pure
    Python, so that importing them costs nothing and fixes no Keras backend."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and not node.level}
    third_party = {name for name in imported
                   if name not in sys.stdlib_module_names and name != "transformerkit"}
    assert not third_party, third_party


def test_the_checker_sees_function_level_imports():
    """The rules above read what they should: a function-level import is an edge."""
    assert "transformerkit.saving" in GRAPH["transformerkit.training.callbacks"]  # in a def
