"""The README is a guide whose commands run as printed: every ``icecdc`` command and flag it shows
exists, its pipeline-file example loads, its ``dagster.yaml`` is a valid Dagster instance config, and
every document it links to is there. (The two set-up commands are CI's own; the demo is
``tests/test_cli.py``.)"""

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from icecdc_dagster.config import parse_config

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def _section(title: str) -> str:
    return README.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_readme_is_a_guide_not_a_notebook():
    assert len(README.splitlines()) < 400


def _commands() -> list[tuple[str, list[str]]]:
    """(subcommand, its flags) for every ``icecdc <subcommand> ...`` in a code span or block."""
    found = []
    for text in re.findall(r"`(icecdc [^`]+)`", README) + _blocks("bash"):
        for match in re.finditer(r"icecdc ([a-z-]+)((?: \[?--?[a-z-]+[^|`\n]*)*)", text):
            found.append((match.group(1), re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", match.group(2))))
    return found


@pytest.mark.parametrize("subcommand,flags", _commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_command_the_readme_shows_exists_with_its_flags(subcommand, flags):
    done = subprocess.run([sys.executable, "-m", "icecdc_dagster.cli", subcommand, "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for flag in flags:
        assert re.search(rf"(?<![\w-]){re.escape(flag)}\b", done.stdout), f"icecdc {subcommand} has no {flag}"


def test_the_pipeline_file_example_loads(tmp_path):
    (example,) = [b for b in _blocks("yaml") if b.lstrip().startswith("catalog:")]
    config = parse_config(yaml.safe_load(example), "README example", tmp_path)
    assert config.tables and config.tables[0].sinks and config.ingest


def test_the_production_dagster_yaml_is_a_valid_instance_config(tmp_path):
    from dagster import DagsterInstance

    (settings,) = [b for b in _blocks("yaml") if b.lstrip().startswith("run_launcher:")]
    (tmp_path / "dagster.yaml").write_text(settings)
    instance = DagsterInstance.from_config(str(tmp_path))
    try:
        assert type(instance.run_launcher).__name__ == "WarmRunLauncher"
        assert instance.run_monitoring_enabled
    finally:
        instance.dispose()


def test_every_linked_document_exists():
    links = re.findall(r"\]\(((?:docs/)[^)#]+)\)", README)
    assert links
    for link in links:
        assert (ROOT / link).is_file(), link


def test_every_exit_code_is_one_sync_can_return():
    from icecdc_dagster import cli

    source = Path(cli.__file__).read_text() + (ROOT / "icecdc_dagster" / "sync.py").read_text()
    for code in map(int, re.findall(r"`(\d+)`", _section("Commands").split("exit codes:", 1)[1])):
        if code > 128:   # killed by a signal: 128 + its number
            assert code - 128 in (signal.SIGINT, signal.SIGTERM) and "128 + " in source, code
        else:
            assert code in (0, 1, 2) or str(code) in source, code
