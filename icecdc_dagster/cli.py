"""icecdc: run the demo, sync all pending batches now, or show where every sink stands."""

import argparse
import json
import os
import sys
import textwrap
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from icecdc_dagster.errors import IcecdcError, InstanceNotFoundError, LineBusyError
from icecdc_dagster.lease.dagster_yaml import ensure_dagster_yaml
from icecdc_dagster.lease.holder import Holder, set_process_role
from icecdc_dagster.progress import SyncProgress, process_started
from icecdc_dagster.progress_display import SyncDisplay
from icecdc_dagster.runtime.rest_server import RestServerOptions, start_rest_server

# The pipeline's modules (config, definitions, sync, status, demo) are imported by the commands that use
# them: they load Spark and Dagster (2-8 s), which `icecdc --help` and `rest-server` never need.

if TYPE_CHECKING:
    from collections.abc import Sequence

    from dagster import DagsterInstance

    from icecdc_dagster.config import PipelineConfig
    from icecdc_dagster.sync import StopRequest, SyncContext, TableSyncReport


def _instance(config: "PipelineConfig", config_path: str | None, dagster_home: str | None,
              create: bool = True) -> "DagsterInstance":
    """The Dagster instance the pipeline's lines run in: ``--dagster-home``, else ``$DAGSTER_HOME``, else
    the pipeline file's ``dagster_home``, else ``.dagster_home`` beside the pipeline file.

    ``create``: a command that writes (sync, resync) makes a missing instance, with the crash-safety
    settings; a read (status) never does: it refuses, naming where it looked and what to set.
    """
    from dagster import DagsterInstance  # dagster: ~4 s, not for --help

    home, origin = _home(config, config_path, dagster_home)
    if create:
        Path(home).mkdir(parents=True, exist_ok=True)
        url = config.instance.postgres_url
        ensure_dagster_yaml(home, url.name if url else None)  # on PostgreSQL when the pipeline file says so
    elif not _is_instance(Path(home)):
        raise InstanceNotFoundError(
            f"no Dagster instance at {home} ({origin}); nothing was created. Set DAGSTER_HOME to the directory "
            f"the line runs in (where `icecdc sync` or `dagster dev` ran), pass --dagster-home, or name it in "
            f"{config_path or 'the pipeline file'} as `dagster_home: <directory>`")
    os.environ["DAGSTER_HOME"] = str(Path(home).resolve())
    return DagsterInstance.get()


def _home(config: "PipelineConfig", config_path: str | None, dagster_home: str | None) -> tuple[str, str]:
    """The instance directory and where that choice came from (for the message of a read that finds none)."""
    if dagster_home:
        return dagster_home, "--dagster-home"
    if os.environ.get("DAGSTER_HOME"):
        return os.environ["DAGSTER_HOME"], "$DAGSTER_HOME"
    if config.dagster_home:
        return config.dagster_home, f"dagster_home in {config_path}"
    base = Path(config_path).resolve().parent if config_path else Path.cwd()
    return str(base / ".dagster_home"), "$DAGSTER_HOME is not set and the pipeline file names no dagster_home"


def _is_instance(home: Path) -> bool:
    """A directory Dagster has used (its settings or its local storage), not merely a path."""
    return home.is_dir() and any((home / name).exists() for name in ("dagster.yaml", "history", "storage"))


EXIT_BLOCKED = 1
EXIT_CHECK_FAILED = 3  # every batch applied, but a data check failed (named in the summary): a person must look
EXIT_BUSY = 75  # EX_TEMPFAIL: another writer holds a line; try again later (or use --wait)
SYNC_EXIT_CODES = """exit status:
  0        every line is synced and every check its batches ran passed
  1        a line is blocked: a batch failed past max_retries or stopped on a terminal error (named,
           with the command that recovers: --retry-failed or icecdc resync)
  2        configuration error
  3        the batches applied, but a check failed (each named: asset, check, snapshot), e.g.
           sink_counts_agree: the target no longer equals the source; find the cause, then icecdc resync
  75       a line is busy with another writer (named; retry later or use --wait), or waits out a
           transient failure's backoff
  130/143  stopped by SIGINT / SIGTERM; run it again to continue
Precedence when lines differ: 1, then 3, then 75, then 0."""


def _sync_context(args: argparse.Namespace, stop: "StopRequest", rebuilt: tuple[str, ...] = (),
                  **options: Any) -> "tuple[PipelineConfig, SyncContext]":
    """The pipeline file, its definitions and the instance, as a sync or resync works with them.
    ``rebuilt``: the table a resync rebuilds (a changed key of it is what the resync is for)."""
    from icecdc_dagster.component import load_pipeline  # a pipeline file or a component defs.yaml; not for --help
    from icecdc_dagster.definitions import build_definitions  # dagster+pyspark: ~10 s, not for --help
    from icecdc_dagster.sync import SyncContext  # dagster+pyspark: ~10 s, not for --help

    config = load_pipeline(args.config)
    instance = _instance(config, args.config, args.dagster_home)  # first: the load compares with its line records
    defs = build_definitions(config, rebuilt=rebuilt)
    context = SyncContext(defs=defs, instance=instance, holder=Holder.current(), wait=args.wait, stop=stop,
                          say=lambda message: print(message, flush=True), log_level=args.log_level,
                          config_path=args.config, **options)
    return config, context


def cmd_sync(args: argparse.Namespace) -> int:
    from icecdc_dagster.sync import StopRequest, sync_all  # dagster+pyspark: ~10 s, not for --help

    set_process_role("icecdc sync")
    # The command's start: the process start when run as the program (interpreter, imports, Spark included),
    # now when another program calls ``main(argv)`` in its own long-lived process.
    started = process_started() if args.as_program else time.monotonic()
    display = SyncDisplay(live=sys.stdout.isatty(), progress=SyncProgress(started=started))
    with StopRequest().installed() as stop:
        with display:
            config, context = _sync_context(args, stop, retry_failed=args.retry_failed, progress=display.progress)
            reports = sync_all(config, context.defs, context.instance, context=context)
        for report in reports:
            for message in report.failed_over:
                print(f"{report.table_name}: failed over a dead worker's run: {message}")
            print(report.render())
        for line in display.summary():
            print(line)
        print(f"sync finished in {display.progress.total():.1f}s (DAGSTER_HOME={os.environ['DAGSTER_HOME']})")
        if stop.requested:
            print(f"icecdc sync: stopped by {stop.name}; run it again to continue where each line stopped")
            return stop.exit_code
    return exit_status(reports)


def exit_status(reports: "Sequence[TableSyncReport]") -> int:
    """The sync's exit status (``SYNC_EXIT_CODES``): the most serious of its lines'."""
    if any(r.blocked or not all(ok for *_, ok in r.runs) for r in reports):
        return EXIT_BLOCKED
    if any(r.failed_checks for r in reports):
        return EXIT_CHECK_FAILED
    # Busy with another writer, or waiting out a transient failure's backoff: try again later.
    return EXIT_BUSY if any(r.busy or r.waiting for r in reports) else 0


def cmd_resync(args: argparse.Namespace) -> int:
    from icecdc_dagster.sync import StopRequest, resync_table  # dagster+pyspark: ~10 s, not for --help

    set_process_role("icecdc resync")
    with StopRequest().installed() as stop:
        config, context = _sync_context(args, stop, rebuilt=(args.table,))
        try:
            report = resync_table(config, context.defs, context.instance, args.table, context=context)
        except LineBusyError as busy:
            print(f"{args.table}: BUSY: {busy}")
            return EXIT_BUSY
        print(report.render())
        if stop.requested:
            return stop.exit_code
    return exit_status([report.sync])


def cmd_status(args: argparse.Namespace) -> int:
    from icecdc_dagster.component import load_pipeline  # a pipeline file or a component defs.yaml; not for --help
    from icecdc_dagster.definitions import build_definitions  # dagster+pyspark: ~10 s, not for --help
    from icecdc_dagster.status import (  # dagster+pyspark: ~9 s, not for --help
        ingest_status,
        status_document,
        table_status,
    )

    config = load_pipeline(args.config)
    instance = _instance(config, args.config, args.dagster_home, create=False)  # a read creates nothing
    defs = build_definitions(config)
    tables = [table_status(defs, instance, table, args.config) for table in config.tables]
    ingests = [ingest_status(instance, entry, defs) for entry in config.ingest]
    if args.json:
        print(json.dumps(status_document(tables, ingests), indent=2))
        return 0
    for rendered in [t.render() for t in tables] + [i.render() for i in ingests]:
        print(rendered)
    return 0


def cmd_config_schema(args: argparse.Namespace) -> int:
    """The pipeline file's JSON schema (for editors and CI), or its Markdown reference."""
    from icecdc_dagster.config import config_schema  # pyiceberg+pydantic: ~4 s, not for --help
    from icecdc_dagster.config.reference import markdown_reference  # pyiceberg+pydantic: ~4 s, not for --help

    if args.component:
        from icecdc_dagster.component.markdown import component_reference  # dagster components: not for --help

        print(component_reference())
        return 0
    print(markdown_reference() if args.markdown else json.dumps(config_schema(), indent=2))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Load the pipeline file and its definitions (tables exist, sinks can follow them), nothing else."""
    from icecdc_dagster.component import load_pipeline  # a pipeline file or a component defs.yaml; not for --help
    from icecdc_dagster.definitions import build_definitions  # dagster+pyspark: ~10 s, not for --help

    config = load_pipeline(args.config)
    defs = build_definitions(config)
    assets = len(list(defs.assets or []))
    print(f"{config.source}: ok ({len(config.tables)} tables, {len(config.ingest)} ingest entries, {assets} assets)")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from icecdc_dagster.demo.run import run_demo  # dagster+pyspark: ~6 s, not for --help

    return run_demo(Path(args.dir), opensearch_url=args.opensearch_url, input_kind=args.input)


def cmd_rest_server(args: argparse.Namespace) -> int:
    """A local Iceberg REST catalog for trials, in the foreground until Ctrl-C."""
    root = Path(args.dir).resolve()
    options = RestServerOptions(db=root / "catalog.db", warehouse=(root / "warehouse").as_uri(), port=args.port,
                                host=args.host, name=args.name, prefix=args.prefix,
                                token=os.environ.get(args.token_env) if args.token_env else None,
                                credential=os.environ.get(args.credential_env) if args.credential_env else None)
    server = start_rest_server(options)
    print(f"Iceberg REST catalog {args.name!r} at {server.url} (tables under {root / 'warehouse'}; other catalogs "
          f"at {server.url}/<name>; log {server.log})", flush=True)
    print(f"pipeline file:\n  catalog: {{type: rest, name: {args.name}, uri: {server.url}}}", flush=True)
    try:
        return server.process.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        server.close()


def _log_level_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", default="INFO", type=str.upper,
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="runs' console log (default INFO: one line per batch step; the event log keeps all)")
    parser.add_argument("-v", "--verbose", dest="log_level", action="store_const", const="DEBUG",
                        help="same as --log-level DEBUG (Dagster's step and engine events)")


def _config_argument(parser: argparse.ArgumentParser) -> None:
    """Optional in the usage line: ``$ICECDC_CONFIG`` names the file too (checked after parsing)."""
    parser.add_argument("--config", default=os.environ.get("ICECDC_CONFIG"),
                        help="pipeline YAML, or the defs.yaml of an IcecdcComponent (default: $ICECDC_CONFIG)")


def main(argv: list[str] | None = None) -> int:
    # Dagster flags APIs we rely on as beta/preview on every import; users of the CLI can't act on it.
    warnings.filterwarnings("ignore", message=".*is currently in (beta|preview).*")
    parser = argparse.ArgumentParser(prog="icecdc", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func, helptext in (("sync", cmd_sync, "apply every pending batch of every ingest entry and table now, in "
                                                     "order (runs recorded in the Dagster instance)"),
                                 ("status", cmd_status, "checkpoint, pending snapshots and lag per sink"),
                                 ("resync", cmd_resync, "re-bootstrap one table's line (after a rollback, an "
                                                        "expired snapshot or a recreated table): full export "
                                                        "that converges every sink")):
        p = sub.add_parser(name, help=helptext, description=textwrap.fill(helptext[0].upper() + helptext[1:] + "."),
                           epilog=SYNC_EXIT_CODES if name in ("sync", "resync") else None,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        _config_argument(p)
        p.add_argument("--dagster-home", default=None,
                       help="Dagster instance directory (default: $DAGSTER_HOME, else the pipeline file's "
                            "dagster_home, else .dagster_home beside it; status never creates one)")
        if name == "status":
            p.add_argument("--json", action="store_true", help="one JSON document for scripts")
        if name == "resync":
            p.add_argument("--table", required=True, help="the table to re-bootstrap (<namespace>.<table>)")
            p.add_argument("--wait", action="store_true", help="wait for another writer of the line")
            _log_level_arguments(p)
        if name == "sync":
            p.add_argument("--retry-failed", action="store_true",
                           help="re-execute, once, each batch that used up its retries and blocks its line")
            p.add_argument("--wait", action="store_true",
                           help="when another writer holds a line, wait for it (default: skip that line, "
                                "name the holder and exit 75)")
            _log_level_arguments(p)
        p.set_defaults(func=func)
    schema = sub.add_parser("config-schema", help="print the pipeline file's JSON schema (--markdown: reference)")
    schema.add_argument("--markdown", action="store_true", help="the Markdown reference (docs/configuration.md)")
    schema.add_argument("--component", action="store_true",
                        help="the IcecdcComponent's Markdown reference (docs/component.md)")
    schema.set_defaults(func=cmd_config_schema)
    validate = sub.add_parser("validate", help="load a pipeline file and check it against the catalog")
    _config_argument(validate)
    validate.set_defaults(func=cmd_validate)
    demo = sub.add_parser("demo", help="local warehouse + demo table with several snapshots, synced end to end")
    demo.add_argument("--dir", default="icecdc-demo", help="where the demo's warehouse, catalog and instance live")
    demo.add_argument("--opensearch-url", default=os.environ.get("ICECDC_DEMO_OPENSEARCH_URL"),
                      help="the OpenSearch cluster of the demo's index (default: an in-memory OpenSearch-"
                           "compatible server the demo starts; the index is gone when the demo ends)")
    demo.add_argument("--input", choices=("files", "nats"), default="files",
                      help="where the customers events come from: landing files, or a NATS JetStream subject "
                           "($ICECDC_DEMO_NATS_URL, default nats://127.0.0.1:4222)")
    demo.set_defaults(func=cmd_demo)
    rest = sub.add_parser("rest-server", help="a local Iceberg REST catalog for trials (JdbcCatalog on SQLite)")
    rest.add_argument("--dir", default="icecdc-rest", help="where its catalog file and warehouse live")
    rest.add_argument("--port", type=int, default=8181, help="0: any free port")
    rest.add_argument("--host", default="127.0.0.1")
    rest.add_argument("--name", default="lake", help="the catalog at <url>/v1 (others answer at <url>/<name>/v1)")
    rest.add_argument("--prefix", default=None, help="serve every route under /v1/<prefix>/ (clients set prefix)")
    rest.add_argument("--token-env", default=None, help="require this variable's value as bearer token")
    rest.add_argument("--credential-env", default=None,
                      help="client_id:client_secret (from this variable) that /v1/oauth/tokens exchanges for the token")
    rest.set_defaults(func=cmd_rest_server)
    args = parser.parse_args(argv)
    args.as_program = argv is None  # the console script: this process is the command
    if getattr(args, "config", "") is None:  # the command takes --config, and $ICECDC_CONFIG is not set either
        parser.error(f"{args.command}: the pipeline file: pass --config FILE or set ICECDC_CONFIG")
    try:
        return args.func(args)
    except IcecdcError as exc:
        print(f"icecdc: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
