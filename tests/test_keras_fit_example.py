"""examples/keras_fit trains at a smoke size, in both of its modes, on 4
logical devices: data parallel with eager execution on, and a 2-stage
pipeline with 4 micro-batches in graph mode (its README's commands run
at full size under `make test-latest`, tests/test_doc_commands.py)."""
import re

import pytest

from tests import training


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode, says", [
    ("dp", "EPL plan: 4 model replica(s) x 1 TaskGraph(s)"),
    ("pipeline", "EPL plan: 2 model replica(s) x 2 TaskGraph(s), 4 "
                 "micro-batch(es)"),
])
def test_keras_fit_example_trains(mode, says):
  printed = training.run_client(
      "examples/keras_fit/train.py", "--mode", mode, "--epochs", "3",
      "--steps_per_epoch", "4", "--batch_size", "64",
      EPL_CLUSTER_NUM_CPU_DEVICES="4")
  assert says in printed, printed
  losses = [float(loss) for loss in re.findall(r"epoch \d  loss (\S+)",
                                               printed)]
  assert len(losses) == 3 and losses[-1] < losses[0], printed
