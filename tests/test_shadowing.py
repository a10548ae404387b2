"""A folder named `epl` (or a module `epl.py`) beside a script, which plain
`python script.py` would import instead of EPL: `epl-launch` and `epl-plan`
refuse to start the script and name it (epl.tools.shadowing).

A folder without `__init__.py` shadows EPL where EPL is not on the path
itself but found by setuptools' editable-install hook, as in the
environments `make` builds; the tests run so: without PYTHONPATH, EPL
imported from the working directory by `python -m`, which is first on the
path and which the check leaves out as the script's Python would.
"""
import os
import subprocess
import sys

import pytest

from epl.tools import launcher
from epl.tools import shadowing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 120


@pytest.fixture(name="shadowed")
def _shadowed(tmp_path):
  """A script whose directory holds a folder `epl` without __init__.py (a
  clone, say), which would be imported as a namespace package."""
  (tmp_path / "epl").mkdir()
  (tmp_path / "epl" / "README.md").write_text("a clone\n")
  script = tmp_path / "train.py"
  script.write_text("import epl\nepl.init()\n")
  return script


@pytest.fixture(name="editable_path")
def _editable_path(monkeypatch):
  """This process's sys.path as under an editable install: no EPL on it
  (the tests found it through PYTHONPATH or the working directory)."""
  monkeypatch.setattr(sys, "path", [
      p for p in sys.path
      if not os.path.isfile(os.path.join(p or ".", "epl", "__init__.py"))])


def _user_env():
  """The environment of a user's shell: no PYTHONPATH."""
  return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_plain_python_imports_the_folder(shadowed):
  # What the user meets without EPL's check: Python's own error.
  result = subprocess.run([sys.executable, str(shadowed)], capture_output=True,
                          text=True, timeout=TIMEOUT, check=False,
                          cwd=str(shadowed.parent), env=_user_env())
  if result.returncode == 0:
    pytest.skip("EPL is installed on the path itself here (not editable), "
                "where a folder without __init__.py does not shadow it")
  assert "has no attribute 'init'" in result.stderr, result.stderr


@pytest.mark.usefixtures("editable_path")
def test_shadowing_path_finds_the_folder_or_module(shadowed, tmp_path):
  assert shadowing.shadowing_path(str(tmp_path)) == str(tmp_path / "epl")
  module_dir = tmp_path / "module"
  module_dir.mkdir()
  (module_dir / "epl.py").write_text("")
  assert shadowing.shadowing_path(str(module_dir)) == str(
      module_dir / "epl.py")
  # EPL's own checkout, and a directory without epl, shadow nothing.
  assert shadowing.shadowing_path(ROOT) is None
  assert shadowing.shadowing_path(os.path.join(ROOT, "examples")) is None


def _assert_refused(command, shadowed):
  result = subprocess.run(command, capture_output=True, text=True,
                          timeout=TIMEOUT, check=False, cwd=ROOT,
                          env=dict(_user_env(), TF_CPP_MIN_LOG_LEVEL="3"))
  assert result.returncode == 2, result.stdout + result.stderr
  folder = str(shadowed.parent / "epl")
  assert "Python would import %s as `epl` instead of EPL" % folder in \
      result.stderr, result.stderr
  assert "Rename or move it" in result.stderr


def test_epl_launch_refuses_a_script_beside_a_folder_named_epl(shadowed):
  _assert_refused([sys.executable, "-m", "epl.tools.launcher",
                   "--num_workers", "1", "--gpu_per_worker", "1", "--cpu",
                   str(shadowed)], shadowed)


@pytest.mark.usefixtures("editable_path")
def test_epl_launch_refuses_python_m_in_such_a_directory(shadowed,
                                                         monkeypatch):
  monkeypatch.chdir(shadowed.parent)
  with pytest.raises(ValueError, match="would import %s as `epl`" %
                     (shadowed.parent / "epl")):
    launcher.command_line(["--", "python", "-m", "train"])
  # A shell script says nothing about its Python's path: not checked.
  assert launcher.command_line(["train.sh"]) == ["bash", "train.sh"]


def test_epl_plan_refuses_a_script_beside_a_folder_named_epl(shadowed):
  _assert_refused([sys.executable, "-m", "epl.tools.dry_run", str(shadowed)],
                  shadowed)
