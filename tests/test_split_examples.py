"""The split examples train on 4 logical CPU devices, both modes each."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(script, *flags):
  env = dict(os.environ, EPL_CLUSTER_NUM_CPU_DEVICES="4",
             TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, script)] + list(flags),
      capture_output=True, text=True, timeout=300, check=False, env=env)
  assert result.returncode == 0, result.stderr[-3000:]
  return result


@pytest.mark.parametrize("mode", ["split", "dp"])
def test_large_classification(mode):
  result = _run("examples/large_classification/train.py", "--mode", mode,
                "--num_classes", "1000", "--feature_dim", "64",
                "--steps", "3")
  lines = [l for l in result.stdout.splitlines() if l.startswith("step ")]
  assert len(lines) == 3 and all("(%s, 4 devices)" % mode in l
                                 for l in lines)
  # kernel and bias, and their two Adam slots each.
  assert ("EPL split: 6 sharded variable(s)" in result.stderr) == (
      mode == "split")


@pytest.mark.parametrize("mode", ["split", "replicated"])
def test_moe(mode):
  result = _run("examples/moe/train.py", "--mode", mode, "--steps", "2",
                "--layers", "1")
  assert len([l for l in result.stdout.splitlines()
              if l.startswith("step ")]) == 2
  assert ("EPL split: " in result.stderr) == (mode == "split")
