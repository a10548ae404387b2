"""The memory savers together: recomputation, ZeRO, mixed precision,
offload and grouped apply, with replicas and micro-batches."""
import pytest

from tests import training
from tests.test_gradient_checkpoint import checkpointed_model

DEVICES = 4
MICRO_BATCHES = 2
MICRO = 8
SCALE = {"cluster.num_cpu_devices": DEVICES,
         "pipeline.num_micro_batch": MICRO_BATCHES}


@pytest.mark.parametrize("zero", ["v0", "v1", "v2", "v3"])
@pytest.mark.parametrize("gc", ["collection", "auto"])
def test_gc_zero_offload_grouped_apply_equal_single_device(gc, zero):
  expected, _, _ = training.train(
      checkpointed_model, "adam",
      batch_size=DEVICES * MICRO_BATCHES * MICRO, with_epl=False)
  actual, _, _ = training.train(
      checkpointed_model, "adam", batch_size=MICRO,
      config=dict(SCALE, **{"gradient_checkpoint.type": gc,
                            "zero.level": zero, "offload.level": "v0",
                            "optimizer.num_apply_group": 2,
                            "zero.min_partition_size": 0}))
  training.assert_close(actual, expected)


@pytest.mark.parametrize("zero", ["v0", "v1", "v2", "v3"])
def test_gc_zero_amp_equal_amp_alone(zero):
  # The combination the original EPL reported (GC + ZeRO + AMP): the other
  # savers change nothing in what mixed precision computes.
  amp = dict(SCALE, **{"amp.level": "O1", "amp.dtype": "bfloat16"})
  expected, _, _ = training.train(checkpointed_model, "adam",
                                  batch_size=MICRO, config=amp)
  actual, _, _ = training.train(
      checkpointed_model, "adam", batch_size=MICRO,
      config=dict(amp, **{"gradient_checkpoint.type": "auto",
                          "zero.level": zero, "zero.min_partition_size": 0}))
  training.assert_close(actual, expected)
