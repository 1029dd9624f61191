"""Inside an analytics team's own dg project: our ``IcecdcComponent`` beside a ``dagster_dbt.DbtProjectComponent``
(a dbt-duckdb project, parsed only) and the team's own asset, job and resource named ``spark``. One scenario with
real parts: ``dg scaffold defs`` writes our component and a skeleton that loads as it is, the project loads
once the skeleton is filled in, the dbt model reads our replica (lineage without a break, keys chosen in the
pipeline file), the team's job keeps its resource and executor, our sensor applies a commit end to end in that
project, ``icecdc status``/``validate`` read the component's ``defs.yaml``, and ``dg check defs`` passes."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import yaml
from dagster import AssetKey, in_process_executor, load_from_defs_folder

from icecdc_dagster.assets import naming
from icecdc_dagster.cli import main
from icecdc_dagster.component import load_pipeline
from icecdc_dagster.lease.executor import line_executor
from icecdc_dagster.resources.keys import SPARK_KEY
from tests.dagster_layer.harness import drain_sensor
from tests.helpers import write_pipeline

PACKAGE = "analytics_team"

TEAM_DEFS = '''
import dagster as dg


class TeamSpark(dg.ConfigurableResource):
    """The team's own resource that happens to be called spark."""

    owner: str


@dg.asset(group_name="team")
def team_report(spark: TeamSpark) -> str:
    return f"report by {spark.owner}"


team_job = dg.define_asset_job("team_job", selection=[team_report], executor_def=dg.in_process_executor)


@dg.definitions
def team() -> dg.Definitions:
    return dg.Definitions(assets=[team_report], resources={"spark": TeamSpark(owner="analytics")}, jobs=[team_job])
'''


def _dg_project(root: Path) -> Path:
    """pyproject with [tool.dg], <package>/definitions.py, defs/ with dbt's and the team's code (ours: scaffolded)."""
    root.mkdir()
    (root / "pyproject.toml").write_text(textwrap.dedent(f"""\
        [project]
        name = "{PACKAGE}"
        version = "0.1.0"
        [tool.dg]
        directory_type = "project"
        [tool.dg.project]
        root_module = "{PACKAGE}"
        """))
    package = root / PACKAGE
    (package / "defs" / "dbt").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "defs" / "__init__.py").write_text("")
    (package / "definitions.py").write_text(textwrap.dedent("""\
        from pathlib import Path

        import dagster as dg


        @dg.definitions
        def defs() -> dg.Definitions:
            return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
        """))
    (package / "defs" / "team_defs.py").write_text(TEAM_DEFS)
    dbt = root / "dbt_project"
    (dbt / "models").mkdir(parents=True)
    (dbt / "dbt_project.yml").write_text("name: analytics\nversion: '1.0'\nprofile: analytics\n")
    (dbt / "profiles.yml").write_text(
        "analytics:\n  target: dev\n  outputs:\n    dev: {type: duckdb, path: analytics.duckdb}\n")
    (dbt / "models" / "sources.yml").write_text(
        "version: 2\nsources:\n  - name: demo_replica\n    tables:\n      - name: orders\n")
    (dbt / "models" / "order_totals.sql").write_text(
        "select count(*) as orders from {{ source('demo_replica', 'orders') }}\n")
    (package / "defs" / "dbt" / "defs.yaml").write_text(yaml.safe_dump({
        "type": "dagster_dbt.DbtProjectComponent", "attributes": {"project": "../../../dbt_project"}}))
    # The manifest dagster-dbt reads: dbt parse only, no data and no warehouse needed.
    parsed = subprocess.run([str(Path(sys.executable).parent / "dbt"), "parse", "--project-dir", str(dbt),
                             "--profiles-dir", str(dbt)], cwd=dbt, capture_output=True, text=True, timeout=300)
    assert parsed.returncode == 0, parsed.stdout[-3000:]
    return package


def _dg(project: Path, *argv: str) -> subprocess.CompletedProcess:
    """A ``dg`` command in the project, as its users run it (our package importable, this venv's tools)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(project), str(Path.cwd())]),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    done = subprocess.run(["dg", *argv], cwd=project, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def _scaffold(project: Path, package: Path) -> Path:
    """``dg scaffold defs icecdc_dagster.IcecdcComponent cdc``: a defs.yaml naming pipeline.yaml beside it, and
    an empty pipeline skeleton that loads with the project's other definitions before any table is named."""
    _dg(project, "scaffold", "defs", "icecdc_dagster.IcecdcComponent", "cdc")
    folder = package / "defs" / "cdc"
    assert yaml.safe_load((folder / "defs.yaml").read_text()) == {
        "type": "icecdc_dagster.IcecdcComponent", "attributes": {"pipeline": "pipeline.yaml"}}
    skeleton = yaml.safe_load((folder / "pipeline.yaml").read_text())
    assert skeleton["tables"] == [] and skeleton["catalog"]["name"] == "lake"
    assert load_pipeline(folder / "defs.yaml").tables == ()
    loaded = load_from_defs_folder(path_within_project=package)
    assert {"icecdc_catalog", "spark"} <= set(loaded.resources or {}) and loaded.resolve_job_def("team_job")
    assert not (folder / "lake").exists()  # an empty pipeline opens no catalog
    return folder


def _rows(catalog, name):  # noqa: ANN001, ANN202
    return sorted(catalog.load_table(name).scan().to_arrow().select(["id", "v"]).to_pylist(), key=lambda r: r["id"])


def test_component_in_a_dg_project_with_dbt_and_the_teams_own_spark(spark, catalog_settings, catalog, instance,
                                                                   tmp_path, monkeypatch, capsys):
    name = catalog_settings.name
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {name}.demo_replica")
    spark.sql(f"CREATE TABLE {name}.db.orders (id BIGINT NOT NULL, v STRING) USING iceberg "
              "TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"INSERT INTO {name}.db.orders VALUES (1, 'a'), (2, 'b')")
    project = tmp_path / "project"
    package = _dg_project(project)
    monkeypatch.syspath_prepend(str(project))
    # The user's flow: scaffold, then fill in the skeleton's pipeline file and the translation.
    cdc = _scaffold(project, package)
    write_pipeline(cdc / "pipeline.yaml", catalog_settings, [
        {"table_name": "db.orders", "identifier_columns": ["id"],
         "sinks": [{"iceberg": {"table_name": "demo_replica.orders", "asset_key": ["demo_replica", "orders"]}}]}])
    component = yaml.safe_load((cdc / "defs.yaml").read_text())
    component["attributes"]["translation"] = {"group_name": "cdc", "tags": {"icecdc/kind": "{{ kind }}"}}
    (cdc / "defs.yaml").write_text(yaml.safe_dump(component))

    defs = load_from_defs_folder(path_within_project=package)
    graph = defs.resolve_asset_graph()
    replica = AssetKey(["demo_replica", "orders"])
    # Lineage without a break: dbt's source demo_replica.orders IS our replica (its key chosen in the file).
    assert graph.get(AssetKey(["order_totals"])).parent_keys == {replica}
    assert graph.get(replica).group_name == "cdc" and graph.get(replica).tags["icecdc/kind"] == "replica"
    assert graph.get(AssetKey(["iceberg", "db", "orders"])).group_name == "cdc"  # the observable source too
    # Merging without traps: their resource named spark and ours side by side, their job keeps their executor.
    assert {"spark", SPARK_KEY} <= set(defs.resources or {}) and defs.executor is None
    team_job = defs.resolve_job_def("team_job")
    assert team_job.executor_def is in_process_executor
    result = team_job.execute_in_process(instance=instance)
    assert result.success and result.output_for_node("team_report") == "report by analytics"

    # Our sensor, in their project, applies the bootstrap and then a commit: the replica equals the source.
    config = load_pipeline(cdc / "defs.yaml")  # what icecdc sync/status see
    table = config.tables[0]
    assert naming.sink_key(table.sinks[0]) == replica
    sensor = defs.resolve_sensor_def(naming.sensor_name(table))
    assert defs.resolve_job_def(sensor.job_name).executor_def is line_executor  # our runs carry our executor
    spark.sql(f"UPDATE {name}.db.orders SET v = 'B' WHERE id = 2")
    spark.sql(f"INSERT INTO {name}.db.orders VALUES (3, 'c')")
    ticks = drain_sensor(defs, instance, naming.sensor_name(table), naming.asset_keys(table))
    assert ticks[-1].requested == [] and all(all(t.succeeded) for t in ticks if t.requested)
    assert _rows(catalog, "demo_replica.orders") == _rows(catalog, "db.orders") == [
        {"id": 1, "v": "a"}, {"id": 2, "v": "B"}, {"id": 3, "v": "c"}]

    # The CLI on the component's defs.yaml: status as a user runs it (its own process, this line's instance),
    # started beside dg check defs; validate in this process (its imports are loaded already).
    status = subprocess.Popen([sys.executable, "-m", "icecdc_dagster.cli", "status", "--config",
                               str(cdc / "defs.yaml"), "--dagster-home", instance.root_directory],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert main(["validate", "--config", str(cdc / "defs.yaml")]) == 0
    assert "ok (1 tables, 0 ingest entries" in capsys.readouterr().out
    # dg's own validation of the project, as its users run it.
    checked = _dg(project, "check", "defs")
    assert "All definitions loaded successfully" in checked.stdout + checked.stderr
    out, err = status.communicate(timeout=600)
    assert status.returncode == 0, err[-3000:]
    head, *sinks = out.splitlines()
    assert head.startswith("db.orders: current snapshot ") and ", 0 not yet applied" in head, out
    assert len(sinks) == 1 and sinks[0].startswith(f"  {table.sinks[0].name}: checkpoint "), out
    assert "up to date" in sinks[0] and "demo_replica.orders" in sinks[0], out


def test_the_component_reference_is_generated_from_its_model():
    from icecdc_dagster.component.markdown import component_reference

    committed = (Path(__file__).parent.parent.parent / "docs" / "component.md").read_text()
    assert committed.strip() == component_reference().strip(), "regenerate: icecdc config-schema --component"
