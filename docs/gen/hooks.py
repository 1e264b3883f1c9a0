"""MkDocs hook: add the generated reference pages to every build.

The CLI, scenario, profile and output references are made from the code on each
`mkdocs build`, never committed, so they cannot go stale. What the code leaves undocumented (a
command, option or schema key without help text) is logged as a warning, which fails
`mkdocs build --strict`.
"""

from __future__ import annotations

import logging

from cli_reference import cli_reference, undocumented
from mkdocs.structure.files import File
from output_reference import output_reference
from schema_reference import schema_reference

from dualpace_hw.cli import app as hw_app
from dualpace_sim.cli.main import app as sim_app
from dualpace_sim.config.scenario import Scenario
from dualpace_sim.costs.profile import PROFILE_FORMAT, Profile

log = logging.getLogger("mkdocs.hooks.reference")

APPS = [(sim_app, "dualpace-sim"), (hw_app, "dualpace-hw")]

CLI_INTRO = """\
Every command of `dualpace-sim` and `dualpace-hw` with the help text its `--help` prints,
generated from the programs themselves when the docs are built. `dualpace-hw` needs the `hw`
extra (`pip install -e ".[hw]"`). Every command also takes `--help`."""

SCENARIO_INTRO = """\
The YAML file that `dualpace-sim run`, `sweep` and `validate` and `dualpace-hw run` read,
generated from its schema (`dualpace_sim/config/scenario.py`, `dualpace_sim/workload/build.py`) when
the docs are built. Unknown keys are errors; a bad value is reported on one line naming the
file, the key and what is allowed. Relative paths resolve against the scenario file's folder.
`scenarios/` has examples: `quickstart.yaml`, one per paper figure under `paper/`, and the H200
box under `h200/`."""

PROFILE_INTRO = f"""\
The calibration profile (`format: {PROFILE_FORMAT}`), generated from its schema
(`dualpace_sim/costs/profile.py`) when the docs are built. YAML, or JSON when the file name
ends in `.json`. All times are in seconds, bandwidths in bytes per second; per-layer tables
are for one transformer layer. A 1-D table is `{{x: [...], y: [...]}}` and a 2-D table
`{{x: [...], y: [...], z: [[...], ...]}}` with `z[i][j]` the value at `(x[i], y[j])`; how the
simulator interpolates them, and what each primitive means for the route costs, is in
[Costs](../costs.md). `dualpace-hw profile` writes measured profiles
([Profiling your box](../profiling.md)); `python -m dualpace_sim.costs.roofline` writes
roofline ones."""


def reference_pages() -> tuple[dict[str, str], list[str]]:
    """{page path: Markdown} and what the code leaves undocumented."""
    scenario = schema_reference(Scenario, "Scenario file reference", SCENARIO_INTRO)
    profile = schema_reference(Profile, "Profile file reference", PROFILE_INTRO)
    pages = {
        "reference/cli.md": cli_reference(APPS, "Command-line reference", CLI_INTRO),
        "reference/scenario.md": scenario.markdown,
        "reference/profile.md": profile.markdown,
        "reference/outputs.md": output_reference(),
    }
    missing = [f"{prog}: {item}" for app, prog in APPS for item in undocumented(app, prog)]
    missing += [f"scenario: {key}" for key in scenario.undocumented]
    missing += [f"profile: {key}" for key in profile.undocumented]
    return pages, missing


def on_files(files, config):
    pages, missing = reference_pages()
    for path, text in pages.items():
        files.append(File.generated(config, path, content=text))
    for item in missing:
        log.warning(f"no help text or description for {item}; add one in the code")
    return files
