"""The engine can be read and tested alone: no Dagster import in changelog/, sinks/, inputs/ (but a sink
kind's ``resource.py``, its Dagster adapter), writer/, ingest/ or pipeline/; and the Dagster layer
never branches on a sink's kind."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "icecdc_dagster"
ENGINE = ("changelog", "sinks", "inputs", "writer", "ingest", "pipeline")


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
