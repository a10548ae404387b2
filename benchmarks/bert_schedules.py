"""The BERT example (examples/bert_large) as a pipeline under each of EPL's
schedules, for pipeline_pictures.py and pipeline_throughput.py.

GPipe, 1F1B and ZB-H1 cut the model into one stage per device; interleaved
1F1B into two per device (pipeline.virtual_stages 2), stage s on device s
mod devices; ZB-V, V-Half and V-Min into two per device in a V, stages s
and 2p - 1 - s on device s. The stages are the example's own (`--parallel pipeline`):
the encoder layers split evenly, the embeddings with the first, the heads
with the last; the schedule and the virtual stages reach the example's EPL
config through its environment variables, as a user would set them. With
`cpu_devices` > 0 the pipeline runs on that many logical CPU devices,
each one thread (a device stands for one core running one op at a time);
with 0 on the GPUs TensorFlow finds (EPL replicates the pipeline over
every multiple of its devices).
"""
import collections
import contextlib
import os
import sys

import tensorflow.compat.v1 as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from epl.ir.graph_state import state_of  # noqa: E402
from examples.bert_large import train  # noqa: E402

# `picture`: its file in docs/ (pipeline_pictures.py), None for none.
Schedule = collections.namedtuple(
    "Schedule", "name strategy virtual_stages picture")
SCHEDULES = (
    Schedule("GPipe", "PreferForward", 1, "pipeline_gpipe.png"),
    Schedule("1F1B", "PreferBackward", 1, "pipeline_1f1b.png"),
    Schedule("interleaved 1F1B", "PreferBackward", 2,
             "pipeline_interleaved.png"),
    Schedule("ZB-H1", "ZeroBubble", 1, "pipeline_zb_h1.png"),
    Schedule("ZB-V", "ZeroBubbleV", 2, "pipeline_zb_v.png"),
    Schedule("V-Half", "ZeroBubbleVHalf", 2, None),
    Schedule("V-Min", "ZeroBubbleVMin", 2, None),
)


def layers_needed(devices):
  """Encoder layers that give every stage of every schedule one or more
  (interleaved 1F1B has two stages per device)."""
  return devices * max(s.virtual_stages for s in SCHEDULES)


@contextlib.contextmanager
def environment(values):
  """Sets the environment variables `values` (a dict) within the block and
  restores them after it (the BERT example reads its EPL settings there)."""
  saved = {key: os.environ.get(key) for key in values}
  os.environ.update(values)
  try:
    yield
  finally:
    for key, value in saved.items():
      if value is None:
        del os.environ[key]
      else:
        os.environ[key] = value


def session_config(cpu_devices):
  """One thread per op and one inter-op thread per logical CPU device;
  TensorFlow's defaults on GPUs."""
  if not cpu_devices:
    return tf.ConfigProto(allow_soft_placement=True)
  return tf.ConfigProto(device_count={"CPU": cpu_devices},
                        intra_op_parallelism_threads=1,
                        inter_op_parallelism_threads=cpu_devices,
                        allow_soft_placement=True)


class Pipeline:
  """The BERT example's training step under one schedule, built in its own
  graph and session, initialised and rewritten (its first step run)."""

  def __init__(self, schedule, devices, cpu_devices, layers, micro_batches,
               micro_batch, seq_length, vocab_size):
    self.schedule = schedule
    self.stages = devices * schedule.virtual_stages
    flags = train.make_flags(
        config="tiny", num_layers=layers, vocab_size=vocab_size,
        seq_length=seq_length, batch_size=micro_batch, parallel="pipeline",
        num_stages=self.stages, num_micro_batch=micro_batches,
        num_cpu_devices=cpu_devices, steps=100000, warmup_steps=10,
        learning_rate=1e-4, dropout=False, seed=1)
    self.graph = tf.Graph()
    with self.graph.as_default(), environment({
        "EPL_PIPELINE_STRATEGY": schedule.strategy,
        "EPL_PIPELINE_VIRTUAL_STAGES": str(schedule.virtual_stages)}):
      handles = train.build_graph(flags)
      self.train_op, self.loss = handles["train_op"], handles["loss"]
      init = tf.global_variables_initializer()
    self.session = tf.Session(graph=self.graph,
                              config=session_config(cpu_devices))
    self.session.run(init)
    self.step()
    self.result = state_of(self.graph).rewrite_result
    plan = self.result.plan
    self.examples = micro_batch * micro_batches * plan.num_replicas
    self.devices = self.stages // plan.virtual_stages

  def step(self):
    """Runs one training step; returns its loss."""
    return self.session.run([self.train_op, self.loss])[1]

  def close(self):
    self.session.close()
