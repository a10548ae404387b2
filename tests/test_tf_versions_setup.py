"""The two TensorFlow versions of the suite: what `make test-latest`,
setup.py's extras and CI promise (tests/tf_versions.py says what each
version lacks)."""
import ast
import os
import shutil
import subprocess

import pytest

from tests import tf_versions

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _extras():
  with open(os.path.join(ROOT, "setup.py")) as f:
    tree = ast.parse(f.read())
  for node in ast.walk(tree):
    if isinstance(node, ast.keyword) and node.arg in ("install_requires",
                                                      "extras_require"):
      yield node.arg, ast.literal_eval(node.value)


def test_each_tensorflow_extra_pins_the_numpy_it_is_built_for():
  found = dict(_extras())
  # No numpy pin in the base requirements: TF 2.15 needs numpy < 2, TF 2.21
  # is built against numpy 2.
  assert [r for r in found["install_requires"]
          if r.startswith("numpy") and "==" in r] == []
  extras = found["extras_require"]
  for name in ("cpu", "gpu"):
    assert "numpy==1.26.4" in extras[name]
    assert any(r.endswith("==2.15.1") for r in extras[name])
  for name in ("cpu-latest", "gpu-latest"):
    assert "tf-keras==2.21.0" in extras[name]
    assert any(r.startswith("numpy==2.") for r in extras[name])
    assert any(r.endswith("==2.21.0") and r.startswith("tensorflow")
               for r in extras[name])


def test_make_test_latest_runs_the_suite_on_the_newest_tensorflow(tmp_path):
  if shutil.which("make") is None:
    pytest.skip("make is not installed")
  plan = subprocess.run(
      ["make", "-n", "test-latest", "LATEST_VENV=%s" % (tmp_path / "v")],
      cwd=ROOT, capture_output=True, text=True, timeout=60,
      check=True).stdout
  assert "-m venv %s" % (tmp_path / "v") in plan
  assert "-e '.[cpu-latest,test,plot]'" in plan
  assert ("TF_USE_LEGACY_KERAS=1 %s/bin/python -m pytest -q -n 2 "
          "--dist loadfile tests" % (tmp_path / "v")) in plan
  # Horovod does not build against it.
  assert "horovod" not in plan.lower()


def test_ci_runs_both_versions():
  with open(os.path.join(ROOT, ".ci", "run")) as f:
    lines = [line.strip() for line in f if not line.startswith("#")]
  assert lines.index("make test || status=$?") < lines.index(
      "make test-latest || status=$?")


def test_version_parsing():
  assert tf_versions.parse("2.21.0") == (2, 21)
  assert tf_versions.parse("2.16.0rc1") == (2, 16)
  assert tf_versions.parse("2.15.1") == (2, 15)
