"""The quick-start example (what `make demo` runs) trains on 4 devices."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_quick_start_trains_data_parallel_on_four_devices():
  env = dict(os.environ, EPL_CLUSTER_NUM_CPU_DEVICES="4",
             TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "examples/quick_start/train.py")],
      capture_output=True, text=True, timeout=300, check=False, env=env)
  assert result.returncode == 0, result.stderr[-3000:]
  lines = [l for l in result.stdout.splitlines() if l.startswith("Iteration")]
  assert len(lines) == 20
  assert "4 model replica(s)" in result.stderr
  losses = [float(l.rsplit(" ", 1)[1]) for l in lines]
  assert sum(losses[-5:]) < sum(losses[:5])


def test_readme_shows_the_quick_start_script_whole():
  with open(os.path.join(ROOT, "README.md")) as readme:
    text = readme.read()
  with open(os.path.join(ROOT, "examples/quick_start/train.py")) as script:
    assert "```python\n" + script.read() + "```\n" in text
