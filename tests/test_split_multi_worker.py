"""epl.split across 2 workers x 2 logical CPU devices (epl-launch in
private namespaces, see tests/multiworker.py): a shard group spanning the
workers (split(4)) and one group per worker (split(2)) both train to the
weights of single-device TF."""
import json
import os

import numpy as np
import pytest

from tests import multiworker
from tests import test_split
from tests import training

pytestmark = pytest.mark.usefixtures("_namespaces")
SCRIPT = os.path.join(multiworker.ROOT, "tests", "workers", "split_worker.py")
STEPS = 3


@pytest.fixture(scope="module")
def _namespaces():
  multiworker.require_namespaces()


@pytest.mark.parametrize("split_count", [4, 2])
def test_split_across_workers_matches_single_device(tmp_path, split_count):
  out = tmp_path / "out"
  out.mkdir()
  job = multiworker.launch(
      ["--num_workers", "2", "--gpu_per_worker", "2", "--cpu", SCRIPT,
       "--out", str(out), "--split", str(split_count), "--steps",
       str(STEPS)], timeout=240)
  assert job.returncode == 0, job.output[-8000:]
  replicas = {}
  for worker in range(2):
    result = json.loads((out / ("worker_%d.json" % worker)).read_text())
    replicas.update({int(r): v for r, v in result["replicas"].items()})
  expected, _, _ = test_split.run(test_split.CLASSES_FOR_WORKERS,
                                  steps=STEPS)
  for replica in range(4):
    values = replicas[replica]
    shard = replica % split_count
    columns = -(-test_split.CLASSES_FOR_WORKERS // split_count)
    for name in ("head/kernel", "head/bias"):
      full = np.pad(expected[name], [(0, 0)] * (expected[name].ndim - 1) + [
          (0, columns * split_count - expected[name].shape[-1])])
      np.testing.assert_allclose(
          np.asarray(values[name]),
          full[..., shard * columns:(shard + 1) * columns], atol=1e-5)
    for name in ("backbone/kernel", "backbone/bias"):
      np.testing.assert_allclose(np.asarray(values[name]), expected[name],
                                 atol=1e-5)
