"""The README's first example, the shortest TF2 script (Keras `fit` with
eager execution on and the two EPL lines), runs as shown and trains data
parallel over the devices EPL has."""
import re

import pytest

from tests import training


def readme_tf2_script():
  """The README's first python block."""
  with open(training.ROOT / "README.md", encoding="utf-8") as readme:
    return re.search(r"```python\n(.*?)```", readme.read(), re.S).group(1)


@pytest.mark.timeout(300)
def test_readme_tf2_script_trains_data_parallel(tmp_path):
  script = readme_tf2_script()
  assert "epl.init()" in script and "model.fit(" in script
  path = tmp_path / "readme_tf2.py"
  path.write_text(script)
  printed = training.run_client(str(path), EPL_CLUSTER_NUM_CPU_DEVICES="4")
  assert "4 model replica(s) x 1 TaskGraph(s)" in printed, printed
  # The loss at the end of each epoch (16 steps of 64 rows): the epoch's
  # last line gives the time per step; the progress bar may also print
  # "16/16 ... ETA: 0s" before it, depending on timing.
  losses = [float(loss) for loss in re.findall(
      r"16/16 [^\n]*?/step - loss: (\d+\.\d+)", printed)]
  assert len(losses) == 2 and losses[-1] < losses[0], printed
