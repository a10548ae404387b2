"""Warnings under EPL read as without it: once each, at the user's line."""
import os
import re
import subprocess
import sys
import warnings

import tensorflow as tf

import epl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK_START = os.path.join(ROOT, "examples", "quick_start", "train.py")


def test_wrapped_tf_warnings_point_at_the_users_line():
  epl.init(epl.Config({"cluster.num_cpu_devices": 2}))
  with tf.Graph().as_default(), warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    x = tf.ones([4, 3])
    line = sys._getframe().f_lineno + 1  # pylint: disable=protected-access
    tf.compat.v1.layers.dense(x, 2)
  dense = [w for w in caught if "tf.layers.dense" in str(w.message)]
  if not dense:  # a Keras that no longer warns
    return
  assert [(w.filename, w.lineno) for w in dense] == [(__file__, line)]


def _deprecations(script):
  """The deprecation warnings `script` prints, with their locations."""
  result = subprocess.run(
      [sys.executable, "-c", script], cwd=ROOT, capture_output=True,
      text=True, timeout=300,
      env=dict(os.environ, EPL_CLUSTER_NUM_CPU_DEVICES="2",
               TF_CPP_MIN_LOG_LEVEL="2"))
  assert result.returncode == 0, result.stderr[-3000:]
  return sorted(line for line in result.stderr.splitlines()
                if re.search("deprecated", line))


def test_epl_prints_the_deprecation_warnings_of_the_script_alone():
  # The quick start, and the same script with its EPL lines replaced by
  # the graph mode that epl.init switches to.
  with open(QUICK_START) as source:
    script = source.read()
  # (Line for line, so that the warnings' line numbers agree.)
  plain = "\n".join(
      "tf.compat.v1.disable_eager_execution()" if line.endswith("# EPL") else
      "" if line.startswith("import epl") else line
      for line in script.splitlines())
  assert "epl." not in plain
  code = "__file__ = %r\nexec(compile(%%r, __file__, 'exec'))" % QUICK_START
  assert _deprecations(code % script) == _deprecations(code % plain)
