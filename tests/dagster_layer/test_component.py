"""Inside an analytics team's own dg project: our ``IcecdcComponent`` beside a ``dagster_dbt.DbtProjectComponent``
(a dbt-duckdb project, parsed only) and the team's own asset, job and resource named ``spark``. One scenario with
real parts: the project loads, the dbt model reads our replica (lineage without a break, keys chosen in the
pipeline file), the team's job keeps its resource and executor, our sensor applies a commit end to end in that
project, and ``dg check defs`` passes."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import yaml
from dagster import AssetKey, in_process_executor, load_from_defs_folder

from icecdc_dagster.assets import naming
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


def _dg_project(root: Path, pipeline: Path) -> Path:
    """pyproject with [tool.dg], <package>/definitions.py, defs/ with our component, dbt's and the team's code."""
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
    (package / "defs" / "cdc").mkdir(parents=True)
    (package / "defs" / "dbt").mkdir()
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
    (package / "defs" / "cdc" / "defs.yaml").write_text(yaml.safe_dump({
        "type": "icecdc_dagster.IcecdcComponent",
        "attributes": {"pipeline": os.path.relpath(pipeline, package / "defs" / "cdc"),
                       "translation": {"group_name": "cdc", "tags": {"icecdc/kind": "{{ kind }}"}}}}))
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


def _rows(catalog, name):  # noqa: ANN001, ANN202
    return sorted(catalog.load_table(name).scan().to_arrow().select(["id", "v"]).to_pylist(), key=lambda r: r["id"])


def test_component_in_a_dg_project_with_dbt_and_the_teams_own_spark(spark, catalog_settings, catalog, instance,
                                                                   tmp_path, monkeypatch):
    name = catalog_settings.name
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {name}.demo_replica")
    spark.sql(f"CREATE TABLE {name}.db.orders (id BIGINT NOT NULL, v STRING) USING iceberg "
              "TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"INSERT INTO {name}.db.orders VALUES (1, 'a'), (2, 'b')")
    pipeline = write_pipeline(tmp_path / "pipeline.yaml", catalog_settings, [
        {"table_name": "db.orders", "identifier_columns": ["id"],
         "sinks": [{"iceberg": {"table_name": "demo_replica.orders", "asset_key": ["demo_replica", "orders"]}}]}])
    project = tmp_path / "project"
    package = _dg_project(project, pipeline)
    monkeypatch.syspath_prepend(str(project))

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
    config = load_pipeline(package / "defs" / "cdc" / "defs.yaml")  # what icecdc sync/status see
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

    # dg's own validation of the project, as its users run it.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(project), str(Path.cwd())]),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    checked = subprocess.run(["dg", "check", "defs"], cwd=project, env=env, capture_output=True, text=True,
                             timeout=600)
    assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-3000:]
    assert "All definitions loaded successfully" in checked.stdout + checked.stderr


def test_the_component_reference_is_generated_from_its_model():
    from icecdc_dagster.component.markdown import component_reference

    committed = (Path(__file__).parent.parent.parent / "docs" / "component.md").read_text()
    assert committed.strip() == component_reference().strip(), "regenerate: icecdc config-schema --component"
