"""The engine can be read and tested alone: no Dagster import in changelog/, sinks/, inputs/ (but a sink
kind's ``resource.py``, its Dagster adapter), writer/, ingest/ or steps/; and the Dagster layer
never branches on a sink's kind."""

import ast
import io
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "icecdc_dagster"
ENGINE = ("changelog", "sinks", "inputs", "writer", "ingest", "steps")


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_engine_modules_do_not_import_dagster():
    offenders = [str(p.relative_to(PACKAGE)) for folder in ENGINE for p in (PACKAGE / folder).rglob("*.py")
                 if p.name != "resource.py" and {"dagster", "dagster_graphql"} & _imports(p)]
    assert offenders == []


def test_dagster_layer_does_not_branch_on_sink_kinds():
    kinds = ("OpenSearchSinkConfig", "IcebergSinkConfig")
    layer = [PACKAGE / "definitions.py", PACKAGE / "status.py", *(PACKAGE / "assets").rglob("*.py"),
             *(PACKAGE / "checks").rglob("*.py"), *(PACKAGE / "sensors").rglob("*.py")]
    offenders = [str(p.relative_to(PACKAGE)) for p in layer if any(k in p.read_text() for k in kinds)]
    assert offenders == []


# The import graph between our own modules. Lower layers never import higher ones; within a layer,
# packages may import each other but no two files import each other. A layer entry is a package or
# module under icecdc_dagster (the longest match decides: ``assets.naming`` sits below ``assets``).
LAYERS = (
    ("errors", "fields", "column_names", "run_tags"),
    ("runtime", "batch", "lineage", "resources"),
    ("changelog", "writer"),
    ("ingest",),
    ("inputs",),  # an input commits through the ingest engine
    ("sinks",),
    ("config",),
    ("steps",),
    ("lease",),
    ("lines",),
    ("assets.naming",),  # the names every Dagster-facing module shares
    ("checks",),  # evaluated in the assets' own steps (the line checks in the changelog's)
    ("assets",),
    ("sensors",),
    ("definitions",),
    ("component",),
    ("progress", "sync_plan", "progress_display"),
    ("sync", "status", "launcher"),
    ("demo",),
    ("cli",),
)
# Two files that import each other, each with the reason it is not split yet.
KNOWN_CYCLES: dict[tuple[str, str], str] = {}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(path: Path, modules: set[str], type_checking: bool = False) -> set[str]:
    """Our modules a file imports when it runs (module level or in a function), and with ``type_checking``
    also those named only for type checking (``if TYPE_CHECKING:``)."""
    found: set[str] = set()

    def resolve(name: str) -> str | None:
        name = name.removeprefix("icecdc_dagster").removeprefix(".")
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if not type_checking and isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                found.update(r for a in child.names if a.name.startswith("icecdc_dagster")
                             and (r := resolve(a.name)))
            elif isinstance(child, ast.ImportFrom) and (child.module or "").startswith("icecdc_dagster"):
                found.update(r for a in child.names if (r := resolve(f"{child.module}.{a.name}")))
            visit(child)

    visit(ast.parse(path.read_text()))
    return found - {_module_name(path)}


def _graph(type_checking: bool = False) -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(files) - {""}
    return {name: _runtime_imports(path, modules, type_checking) for name, path in files.items() if name}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every set of modules that reach each other through imports (Tarjan's strongly connected components
    of more than one module), whatever the cycle's length."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = stack[stack.index(module):]
            del stack[stack.index(module):]
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(cycles)


def _layer(module: str) -> int:
    entries = {entry: i for i, layer in enumerate(LAYERS) for entry in layer}
    name = module
    while name not in entries:
        assert "." in name, f"{module} is in no layer of LAYERS"
        name = name.rpartition(".")[0]
    return entries[name]


def upward_imports() -> list[str]:
    return sorted(f"{a} -> {b}" for a, targets in _graph().items() for b in targets if _layer(b) > _layer(a))


def two_file_cycles() -> list[tuple[str, str]]:
    graph = _graph()
    return sorted((a, b) for a, targets in graph.items() for b in targets if a < b and a in graph.get(b, ()))


def test_imports_point_down():
    assert upward_imports() == []


def test_no_two_files_import_each_other():
    assert [c for c in two_file_cycles() if c not in KNOWN_CYCLES] == []


def test_no_import_cycles_even_for_type_checking():
    """A folder's files import one way too: a plugin's ``config.py`` does not import its ``reader.py`` back
    (the registry builds the reader), even where the import is only for type checking."""
    assert import_cycles(_graph(type_checking=True)) == []


def test_import_cycles_are_found_within_a_folder():
    graph = {"inputs.kind.config": {"inputs.kind.reader"}, "inputs.kind.reader": {"inputs.kind.config"},
             "a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"], ["inputs.kind.config", "inputs.kind.reader"]]


# File names that repeat by design: the same role in each plugin folder of a family (``sinks/<kind>/config.py``,
# ``inputs/<kind>/reader.py``) and each family's own contract and registry (``sinks/base.py``).
PLUGIN_FAMILIES = {"sinks", "inputs"}
FAMILY_ROLES = {"base.py", "registry.py"}


def _plugin_role(path: Path) -> bool:
    family = path.parts[0] in PLUGIN_FAMILIES
    return family and (len(path.parts) == 3 or (len(path.parts) == 2 and path.name in FAMILY_ROLES))


def colliding_file_names() -> list[str]:
    by_name: dict[str, list[Path]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            by_name.setdefault(path.name, []).append(path.relative_to(PACKAGE))
    return sorted(f"{name}: {', '.join(map(str, sorted(paths)))}" for name, paths in by_name.items()
                  if len(paths) > 1 and not all(map(_plugin_role, paths)))


def test_file_names_collide_only_in_plugin_roles():
    assert colliding_file_names() == []


def test_no_private_names_across_modules():
    """``from x import _name`` and ``module._name`` of our own modules: a private name is the module's own."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        ours = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                and (n.module or "").startswith("icecdc_dagster") for a in n.names}
        offenders += [f"{_module_name(path)}: {a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                      and (n.module or "").startswith("icecdc_dagster") for a in n.names if a.name.startswith("_")]
        offenders += [f"{_module_name(path)}: {n.value.id}.{n.attr}" for n in ast.walk(tree)
                      if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in ours
                      and n.attr.startswith("_") and not n.attr.startswith("__")]
    assert offenders == []


# The one module that reads a definitions' raw resources and initialises them outside a run.
RESOLVED_MODULE = PACKAGE / "resources" / "resolved.py"


def _raw_resource_reads(path: Path) -> list[str]:
    """``x.resources`` read other than as Dagster's initialised ``context.resources`` or handed back to
    Dagster as a ``resources=`` argument (which initialises them), and any ``process_config_and_initialize``."""
    tree = ast.parse(path.read_text())
    handed = {id(k.value) for node in ast.walk(tree) if isinstance(node, ast.Call) for k in node.keywords
              if k.arg == "resources"}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "process_config_and_initialize":
            found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
        elif (isinstance(node, ast.Attribute) and node.attr == "resources" and id(node) not in handed
              and not (isinstance(node.value, ast.Name) and node.value.id == "context")):
            found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return found


def test_raw_resources_are_read_only_through_the_resolved_module():
    """A definitions' resource holds its secrets as ``EnvVar``s (the variables' NAMES) until Dagster
    initialises it: outside a run, code takes resources from ``resources.resolved`` and nowhere else."""
    files = [*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "bench").rglob("*.py")]
    offenders = [hit for path in files if path != RESOLVED_MODULE for hit in _raw_resource_reads(path)]
    assert offenders == []
    assert _raw_resource_reads(RESOLVED_MODULE)  # the rule sees the one module that does it


def late_imports_without_reason(root: Path = PACKAGE) -> list[str]:
    """``import``/``from`` inside a function of our package whose lines carry no ``#`` comment: a late
    import says why it is late (a heavy library the caller's path does not need, an optional package,
    a name clash, the engine's ban on Dagster), else it belongs at the module's top."""
    offenders = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        commented = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(text).readline)
                     if tok.type == tokenize.COMMENT}
        for function in ast.walk(ast.parse(text)):
            if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                offenders += [f"{path.relative_to(root)}:{node.lineno} {ast.unparse(node)}"
                              for node in function.body for node in ast.walk(node)
                              if isinstance(node, ast.Import | ast.ImportFrom)
                              and not commented & set(range(node.lineno, node.end_lineno + 1))]
    return sorted(set(offenders))


def test_every_late_import_says_why():
    assert late_imports_without_reason() == []


def test_a_late_import_without_a_reason_is_found(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    import json\n    from os import path  # stdlib, cheap: kept to show a reason\n")
    assert late_imports_without_reason(tmp_path) == ["m.py:2 import json"]


if __name__ == "__main__":  # python tests/test_layers.py: the graph's problems, for a person to read
    print("upward imports:", *upward_imports(), sep="\n  ")
    print("two-file cycles:", *two_file_cycles(), sep="\n  ")
    print("cycles (type checking included):", *import_cycles(_graph(type_checking=True)), sep="\n  ")
    print("colliding file names:", *colliding_file_names(), sep="\n  ")
    print("late imports without a reason:", *late_imports_without_reason(), sep="\n  ")
