"""The commands the README and the examples' READMEs document run as
written, so that a renamed flag, module or entry point breaks a test
rather than a user's first hour.

A fenced block whose line before it is `<!-- test: run -->` is run, each
command (a line, with `\\` continuations; `#` lines are comments) in a
subprocess from the repository root, with this test's Python environment
first on PATH: `python`, `epl-plan` and `epl-launch` are the venv's, as
after `source .venv-latest/bin/activate`. `<!-- test: run ARGS -->` appends
ARGS to every command of the block: smoke sizes (fewer steps, a smaller
model) for the documented full-size runs.

The commands are documented for the first environment, `.venv-latest`
(the newest TensorFlow), so they run under `make test-latest` and skip on
TensorFlow 2.15 (`make test`); as in a user's shell, without
TF_USE_LEGACY_KERAS, which that environment sets itself.
"""
import ast
import glob
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests import tf_versions

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(
    os.path.relpath(path, ROOT)
    for path in glob.glob(os.path.join(ROOT, "examples", "**", "README.md"),
                          recursive=True))
EXAMPLES = sorted(
    name for name in os.listdir(os.path.join(ROOT, "examples"))
    if os.path.isfile(os.path.join(ROOT, "examples", name, "train.py")))
_MARKER = re.compile(r"^<!-- test: run(?P<args>( [^>]*)?) -->$")
TIMEOUT = 300


def documented_commands(page):
  """[(id, command)] of the marked blocks of `page`, ARGS appended."""
  with open(os.path.join(ROOT, page), encoding="utf-8") as source:
    lines = source.read().splitlines()
  commands = []
  for index, line in enumerate(lines):
    marker = _MARKER.match(line.strip())
    if marker is None:
      continue
    assert lines[index + 1].startswith("```"), (
        "%s:%d: the test marker must be right before a fenced block" %
        (page, index + 1))
    extra = marker.group("args").strip()
    pending, start = "", None
    for number in range(index + 2, len(lines)):
      text = lines[number].strip()
      if text.startswith("```"):
        break
      if not pending and (not text or text.startswith("#")):
        continue
      if start is None:
        start = number + 1
      if text.endswith("\\"):
        pending += text[:-1] + " "
        continue
      command = (pending + text + (" " + extra if extra else "")).strip()
      commands.append(("%s:%d" % (page, start), command))
      pending, start = "", None
  return commands


def _first_of_each(entries):
  seen = set()
  for where, command in entries:
    if command not in seen:
      seen.add(command)
      yield where, command


# Each command once, where it is first documented.
COMMANDS = list(_first_of_each(
    entry for page in PAGES for entry in documented_commands(page)))


def test_every_example_has_a_readme_with_a_tested_command():
  for name in EXAMPLES:
    page = os.path.join("examples", name, "README.md")
    assert page in PAGES, "%s has no README.md" % name
    assert documented_commands(page), (
        "%s marks no command with <!-- test: run -->" % page)
  assert documented_commands("README.md")


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_help_describes_it_whole(name):
  # The argparse examples' `--help` shows the first paragraph of their
  # docstring (read here, not imported: quick_start trains on import).
  path = os.path.join(ROOT, "examples", name, "train.py")
  with open(path, encoding="utf-8") as source:
    text = source.read()
  if "argparse" not in text:
    return
  description = ast.get_docstring(ast.parse(text)).split("\n\n")[0]
  assert description.rstrip().endswith("."), (
      "examples/%s/train.py: --help would end mid-sentence: %r" %
      (name, description))


@pytest.mark.skipif(
    tf_versions.TF <= tf_versions.PRIMARY_TF,
    reason="the README's commands are documented for .venv-latest, the "
           "newest TensorFlow: `make test-latest` runs them")
@pytest.mark.parametrize("where, command", COMMANDS,
                         ids=[where for where, _ in COMMANDS])
def test_documented_command_runs(where, command):
  # As a user's shell has it: no EPL settings, no PYTHONPATH, no
  # TF_USE_LEGACY_KERAS.
  environment = {k: v for k, v in os.environ.items()
                 if not k.startswith("EPL_") and
                 k not in ("PYTHONPATH", "TF_USE_LEGACY_KERAS")}
  environment["PATH"] = (os.path.dirname(sys.executable) + os.pathsep +
                         environment.get("PATH", ""))
  environment["TF_CPP_MIN_LOG_LEVEL"] = "2"
  result = subprocess.run(["bash", "-c", command], cwd=ROOT,
                          env=environment, capture_output=True, text=True,
                          timeout=TIMEOUT, check=False)
  assert result.returncode == 0, "%s: %s failed:\n%s" % (
      where, shlex.quote(command), (result.stdout + result.stderr)[-4000:])
