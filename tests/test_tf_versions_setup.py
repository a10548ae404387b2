"""The two TensorFlow versions of the suite and the Pythons they run on:
what the first environment (`.venv-latest`), `make test-latest`, setup.py's
extras and CI promise (tests/tf_versions.py says what each version
lacks)."""
import ast
import os
import shutil
import subprocess
import sys

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


def _make_plan(*arguments):
  if shutil.which("make") is None:
    pytest.skip("make is not installed")
  return subprocess.run(["make", "-n"] + list(arguments), cwd=ROOT,
                        capture_output=True, text=True, timeout=60,
                        check=True).stdout


def test_make_test_latest_runs_the_suite_on_the_newest_tensorflow(tmp_path):
  venv = tmp_path / "v"
  plan = _make_plan("test-latest", "LATEST_VENV=%s" % venv,
                    "PYTHON=python3.13")
  # On the Python given (CI gives 3.13).
  assert "python3.13 -m venv %s" % venv in plan
  assert "-e '.[cpu-latest,test,plot]'" in plan
  # The environment sets TF_USE_LEGACY_KERAS itself: no variable on the
  # command.
  assert "cp env/tf_use_legacy_keras.pth " in plan
  assert ("\n%s/bin/python -m pytest -q -n 2 --dist loadfile tests" % venv
          in plan)
  assert "TF_USE_LEGACY_KERAS" not in plan
  # Horovod does not build against it.
  assert "horovod" not in plan.lower()


def _python_version(python):
  return subprocess.run(
      [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
      capture_output=True, text=True, timeout=60, check=True).stdout.strip()


def _other_python():
  """A Python of another version than this one, found as CI finds 3.13;
  skips where there is none."""
  mine = "%d.%d" % sys.version_info[:2]
  for version in ("3.13", "3.12", "3.11"):
    if version == mine:
      continue
    python = subprocess.run(
        [os.path.join(ROOT, ".ci", "find-python"), version, "none"],
        capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    if python != "none":
      return python, version
  pytest.skip("no Python but %s on this machine" % mine)


def test_make_rebuilds_the_latest_venv_for_another_python(tmp_path):
  venv = tmp_path / "v"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)],
                 timeout=120, check=True)
  python, version = _other_python()
  plan = _make_plan("venv-latest", "LATEST_VENV=%s" % venv,
                    "PYTHON=%s" % python)
  assert ("%s has Python %d.%d, PYTHON=%s is Python %s: rebuilding" % (
      venv, sys.version_info[0], sys.version_info[1], python, version)
          in plan)
  assert "%s -m venv --clear %s" % (python, venv) in plan
  # Without PYTHON, the venv is kept whatever its Python.
  assert "--clear" not in _make_plan("venv-latest", "LATEST_VENV=%s" % venv)


def test_first_commands_build_one_environment(tmp_path):
  """`make demo` and `make quick-start` run in .venv-latest, the newest
  TensorFlow; neither builds .venv (TF 2.15, Horovod)."""
  latest, primary = tmp_path / "latest", tmp_path / "primary"
  plan = _make_plan("demo", "quick-start", "LATEST_VENV=%s" % latest,
                    "VENV=%s" % primary)
  assert "%s/bin/python examples/bert_large/train.py" % latest in plan
  assert ("EPL_CLUSTER_NUM_CPU_DEVICES=4 TF_CPP_MIN_LOG_LEVEL=2 "
          "%s/bin/python examples/quick_start/train.py" % latest) in plan
  assert str(primary) not in plan and "horovod" not in plan.lower()
  assert "TF_USE_LEGACY_KERAS" not in plan
  for target in ("test", "test-tf1"):
    assert "%s/bin/python" % primary in _make_plan(target, "VENV=%s" % primary)


def test_legacy_keras_pth_sets_the_variable_unless_set(tmp_path):
  shutil.copy(os.path.join(ROOT, "env", "tf_use_legacy_keras.pth"), tmp_path)
  show = ("import os, site; site.addsitedir(%r); "
          "print(os.environ.get('TF_USE_LEGACY_KERAS'))" % str(tmp_path))
  for given, expected in ((None, "1"), ("0", "0")):
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    if given is not None:
      env["TF_USE_LEGACY_KERAS"] = given
    out = subprocess.run([sys.executable, "-c", show], env=env,
                         capture_output=True, text=True, timeout=60,
                         check=True).stdout
    assert out.strip() == expected


@pytest.mark.skipif(tf_versions.TF <= tf_versions.PRIMARY_TF,
                    reason="TF_USE_LEGACY_KERAS is .venv-latest's (TF 2.16+)")
def test_latest_venv_sets_legacy_keras_for_its_python():
  if not os.path.exists(os.path.join(sys.prefix, ".epl-installed")):
    pytest.skip("%s was not built by `make venv-latest`" % sys.prefix)
  env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
  out = subprocess.run(
      [sys.executable, "-c", "import tensorflow as tf; "
       "print(tf.compat.v1.layers.Dense.__module__)"], env=env,
      capture_output=True, text=True, timeout=120, check=True).stdout
  assert out.strip().startswith("tf_keras."), out


def test_legacy_keras_without_tf_keras_does_not_break_tensorflow():
  """TF_USE_LEGACY_KERAS=1 left in the shell for another environment, in
  one without tf-keras (TF 2.15's): TensorFlow's lazy loader would recurse
  without end on tf.keras; `import epl` removes the variable and
  `epl.init` says so."""
  script = (
      "import sys\n"
      "sys.modules['tf_keras'] = None  # as if tf-keras were not installed\n"
      "import tensorflow as tf\n"
      "import epl\n"
      "epl.init(epl.Config({'cluster.num_cpu_devices': 1}))\n"
      "print('keras', tf.keras.layers.Dense(2).__class__.__module__)\n")
  result = subprocess.run(
      [sys.executable, "-c", script], cwd=ROOT, capture_output=True,
      text=True, timeout=120, check=False,
      env=dict(os.environ, TF_USE_LEGACY_KERAS="1", PYTHONPATH=ROOT,
               TF_CPP_MIN_LOG_LEVEL="3"))
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr
  assert "keras keras." in result.stdout, result.stdout
  assert ("[EPL WARNING] epl.init: TF_USE_LEGACY_KERAS=1 was removed from "
          "this process's environment: tf-keras is not installed") in \
      result.stderr, result.stderr


def test_ci_runs_both_versions_the_latest_on_python_3_13():
  with open(os.path.join(ROOT, ".ci", "run")) as f:
    lines = [line.strip() for line in f if not line.startswith("#")]
  assert 'latest_python="$(.ci/find-python 3.13 python3.11)"' in lines
  # The TF 2.21 suite once, on that Python.
  assert [l for l in lines if "make test-latest" in l] == [
      'make test-latest PYTHON="${latest_python}" || status=$?']
  assert lines.index("make test || status=$?") < lines.index(
      'make test-latest PYTHON="${latest_python}" || status=$?')


def test_find_python_finds_pyenvs_or_falls_back_loudly():
  find = os.path.join(ROOT, ".ci", "find-python")
  missing = subprocess.run([find, "3.99", "python3.11"], capture_output=True,
                           text=True, timeout=60, check=True)
  assert missing.stdout.strip() == "python3.11"
  assert "does NOT test Python 3.99" in missing.stderr
  found = subprocess.run([find, "3.13", "none"], capture_output=True,
                         text=True, timeout=60, check=True).stdout.strip()
  if found == "none":
    pytest.skip("no Python 3.13 on this machine (CI falls back, loudly)")
  assert _python_version(found) == "3.13"


def test_setup_declares_the_pythons_it_is_tested_on():
  with open(os.path.join(ROOT, "setup.py")) as f:
    text = f.read()
  assert 'python_requires=">=3.11,<3.14"' in text
  for version in ("3.11", "3.12", "3.13"):
    assert '"Programming Language :: Python :: %s"' % version in text


def test_version_parsing():
  assert tf_versions.parse("2.21.0") == (2, 21)
  assert tf_versions.parse("2.16.0rc1") == (2, 16)
  assert tf_versions.parse("2.15.1") == (2, 15)
