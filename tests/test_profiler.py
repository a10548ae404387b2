"""epl.profiler: measured memory per device as a SessionRunHook; the FLOPs
names of the original raise as not built."""
import csv
import os

import pytest
import tensorflow as tf

import epl
from epl.profiler import flops
from epl.profiler.memory_profiler_hook import MemoryProfilerHook
from tests import training

WIDTH = 128


def test_memory_profiler_hook_under_data_parallelism(tmp_path):
  epl.init(epl.Config({"cluster.num_cpu_devices": 2}))
  epl.set_default_strategy(epl.replicate(device_count=1))
  hook = MemoryProfilerHook(save_steps=2, max_steps=4,
                            output_dir=str(tmp_path), dump_metadata=True)
  with tf.Graph().as_default():
    x, _ = training.input_batch(32)
    hidden = x
    for _ in range(3):
      hidden = tf.compat.v1.layers.dense(hidden, WIDTH, tf.nn.relu)
    loss = tf.reduce_mean(hidden)
    step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).minimize(
        loss, global_step=step)
    with tf.compat.v1.train.MonitoredTrainingSession(
        hooks=[hook, tf.compat.v1.train.StopAtStepHook(last_step=5)]) as sess:
      while not sess.should_stop():
        sess.run(train_op)
  assert sorted(hook.results) == [2, 4]
  assert sorted(os.listdir(tmp_path)) == sorted(
      ["run_metadata_2.bin", "run_metadata_4.bin"] +
      ["step_%d_memory%s" % (n, ext) for n in (2, 4)
       for ext in (".csv", "_timeline.csv", ".png")])
  parameters = (training.FEATURES * WIDTH + WIDTH) + 2 * (WIDTH * WIDTH +
                                                          WIDTH)
  memory = hook.results[4]
  assert len(memory) == 2
  for device in memory:
    # Each replica's weights and momentum slots (the device holding the
    # shared global_step has 8 bytes more).
    assert 0 <= device.persistent - 2 * 4 * parameters <= 8, device
    # At least one layer's activations of the 32-row batch.
    assert device.step_peak >= 32 * WIDTH * 4, device
    assert device.peak == device.persistent + device.step_peak
  with open(tmp_path / "step_4_memory.csv") as rows:
    table = list(csv.DictReader(rows))
  assert [int(r["peak_bytes"]) for r in table] == [m.peak for m in memory]


def test_hook_arguments_are_checked():
  with pytest.raises(ValueError, match="save_steps"):
    MemoryProfilerHook(save_steps=6, max_steps=5)


def test_flops_names_exist_and_say_they_are_not_built():
  with pytest.raises(NotImplementedError, match="not built yet"):
    flops.FlopsProfilerHook()
  with pytest.raises(NotImplementedError, match="not built yet"):
    flops.profile_flops()
