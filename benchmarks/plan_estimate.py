"""Estimated against measured peak memory per device (what `epl-plan`
prints against what a step really uses), BERT on logical CPU devices.

For each setting of SETTINGS, one process builds examples/bert_large's
training graph (tiny preset, synthetic input) with the setting's flags and
EPL config keys (as EPL_<SECTION>_<KEY> environment variables), then:

  1. estimate: opens a session and runs the variable initializer; the
     rewrite runs before that first run, and
     epl.tools.memory_estimate.estimate(context) counts the rewritten
     graph, as the dry run does;
  2. persistent check: the bytes the process's CPU allocator holds
     between steps (after the warm-up steps) minus before the initializer
     (tf.config.experimental.get_memory_info("CPU:0")["current"]; every
     logical CPU device shares that one allocator), against the variable
     bytes the estimate counts over all devices. Not after the initializer
     alone: variables initialised with equal constant values share one
     buffer until their first update writes them;
  3. measure: runs --warmup steps, then one step with
     RunOptions.FULL_TRACE, and takes each device's peak with
     epl.tools.memory_profiler_hook.profile_memory: the bytes of the
     variables the step used on that device (persistent) plus the high-water
     mark of the allocation and deallocation records of that device's ops
     in the step stats, in time order (step peak);
  4. prints per device the estimate, the measured peak and their ratio,
     and the allocator's peak over the traced step (all devices at once)
     beside the sum of the per-device figures.

    python benchmarks/plan_estimate.py                 # every setting
    python benchmarks/plan_estimate.py --settings data,pipeline_1f1b
"""
import argparse
import collections
import logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# get_memory_info("CPU:0") raises "Allocator stats not available" unless
# the CPU allocator is the BFC one, chosen before TensorFlow starts.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

import tensorflow.compat.v1 as tf  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

import epl  # noqa: E402
from benchmarks import smoke  # noqa: E402
from epl.tools import memory_estimate  # noqa: E402
from epl.config import key_info  # noqa: E402
from epl.ir.graph_state import state_of  # noqa: E402
from epl.tools.memory_profiler_hook import profile_memory  # noqa: E402
from epl.tools.timeline import device_key  # noqa: E402
from examples.bert_large import train  # noqa: E402

PIPELINE = dict(parallel="pipeline_data", num_stages=2, num_micro_batch=4,
                num_cpu_devices=4)
LARGER = dict(num_layers=4, batch_size=16, seq_length=128)
# Setting name -> (train.py flags, EPL config keys).
SETTINGS = collections.OrderedDict([
    ("pipeline_1f1b", (dict(PIPELINE, schedule="PreferBackward"), {})),
    ("pipeline_gpipe", (dict(PIPELINE, schedule="PreferForward"), {})),
    ("data", (dict(parallel="data", num_cpu_devices=2), {})),
    ("data_larger", (dict(LARGER, parallel="data", num_cpu_devices=2), {})),
    ("data_larger_gc_auto", (dict(LARGER, parallel="data",
                                  num_cpu_devices=2),
                             {"gradient_checkpoint.type": "auto"})),
    ("pipeline_gc_auto", (dict(PIPELINE, num_layers=4, seq_length=128),
                          {"gradient_checkpoint.type": "auto"})),
    ("data_zero_v1", (dict(parallel="data", num_cpu_devices=2),
                      {"zero.level": "v1"})),
    ("data_amp_bf16", (dict(parallel="data", num_cpu_devices=2),
                       {"amp.level": "O1", "amp.dtype": "bfloat16"})),
    # Stages cut by auto parallel (4 layers), with automatic recomputation.
    ("auto_2_stages", (dict(PIPELINE, parallel="auto", num_layers=4),
                       {})),
    ("auto_4_stages_gc_auto", (dict(PIPELINE, parallel="auto", num_stages=4,
                                    num_layers=4, seq_length=128),
                               {"gradient_checkpoint.type": "auto"})),
])
MIB = 2.0 ** 20
SMOKE = ["--settings", "data", "--warmup", "1"]


def _allocator(field):
  return tf.config.experimental.get_memory_info("CPU:0")[field]


def measure(flags, keys, warmup):
  """(estimates, measured DeviceMemory list, persistent delta bytes,
  allocator peak bytes of the traced step)."""
  for key, value in keys.items():
    os.environ[key_info(key).env_var] = str(value)
  graph = tf.Graph()
  with graph.as_default():
    built = train.build_graph(train.make_flags(steps=1000, **flags))
    logging.getLogger("epl").setLevel(logging.WARNING)
    fetches = [built["train_op"], built["loss"]]
    with tf.Session() as session:
      before = _allocator("current")
      session.run(tf.global_variables_initializer())
      estimates = memory_estimate.estimate(state_of(graph).rewrite_result)
      for _ in range(warmup):
        session.run(fetches)
      persistent = _allocator("current") - before
      tf.config.experimental.reset_memory_stats("CPU:0")
      metadata = tf.RunMetadata()
      session.run(fetches, options=tf.RunOptions(
          trace_level=tf.RunOptions.FULL_TRACE), run_metadata=metadata)
      allocator_peak = _allocator("peak")
      measured = profile_memory(metadata, graph, visualize=False)
  epl.shutdown()
  return estimates, measured, persistent, allocator_peak


def report(name, flags, keys, result):
  estimates, measured, persistent, allocator_peak = result
  print("\n%s: %s %s" % (name, " ".join("--%s %s" % kv for kv in
                                         flags.items()), keys or ""))
  by_device = {device_key(m.device): m for m in measured}
  print("  %-14s %7s %8s %8s %8s %7s" % ("device", "stages", "est MiB",
                                        "meas MiB", "est/meas",
                                        "persist"))
  ratios = []
  for e in estimates:
    m = by_device.get(device_key(e.device))
    if m is None or not e.total:
      continue
    ratio = e.total / float(m.peak)
    ratios.append(ratio)
    print("  %-14s %7s %8.2f %8.2f %8.3f %7.2f" % (
        e.device, ",".join(map(str, e.stages)) or "-", e.total / MIB,
        m.peak / MIB, ratio, m.persistent / MIB))
  counted = sum(e.persistent for e in estimates)
  print("  variables: estimate %.2f MiB, allocator between steps %.2f MiB "
        "(ratio %.3f)" % (counted / MIB, persistent / MIB,
                          counted / float(max(persistent, 1))))
  print("  traced step, all devices: allocator peak %.2f MiB; sum of "
        "per-device peaks measured %.2f, estimated %.2f" % (
            allocator_peak / MIB, sum(m.peak for m in measured) / MIB,
            sum(e.total for e in estimates) / MIB))
  return ratios


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--settings", default=",".join(SETTINGS))
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--dropout", type=int, default=1,
                      help="1: dropout on, as train.py runs by default")
  args = smoke.parse_args(parser, argv, SMOKE)
  tf.disable_eager_execution()
  print("Estimated (epl.tools.memory_estimate) vs measured (FULL_TRACE "
        "step stats: variables + step high-water mark) peak memory per "
        "device; BERT tiny preset, synthetic input; TensorFlow %s" %
        tf.__version__)
  worst = []
  for name in args.settings.split(","):
    flags, keys = SETTINGS[name]
    flags = dict(flags, config="tiny", dropout=bool(args.dropout))
    saved = {key_info(k).env_var: os.environ.get(key_info(k).env_var)
             for k in keys}
    try:
      ratios = report(name, flags, keys, measure(flags, keys, args.warmup))
    finally:
      for variable, value in saved.items():
        if value is None:
          os.environ.pop(variable, None)
        else:
          os.environ[variable] = value
    worst.append((name, min(ratios), max(ratios)))
  print("\nest/meas range per setting:")
  for name, low, high in worst:
    print("  %-22s %.3f .. %.3f%s" % (name, low, high,
                                      "" if 0.75 <= low and high <= 1.25
                                      else "  OUTSIDE 25%"))


if __name__ == "__main__":
  main()
