"""What ZeRO, offload and grouped apply save: BERT with 4 data-parallel
replicas on 4 logical CPU devices, each saver alone and together, against
the same run without savers.

Every run trains the example BERT (`examples/bert_large`, tiny by default,
AdamW, dropout off, synthetic input, the same seed) with
`--parallel data` on 4 logical CPU devices and `--num_micro_batch`
micro-batches a step (2 by default: ZeRO v1 and v2 differ there), the
savers set through their EPL_* environment variables (the example reads
its EPL config from them). The runs are built one after the other in this
process; each trains `--steps` steps (the first is a warm-up, left out of
the step time), then one traced step gives the peak memory per device.

Columns, each as an absolute figure and as a ratio to "none":
  peak/dev   the largest peak a replica device allocated during the traced
             step (RunMetadata allocation records; memory held before the
             step, such as variables, is not in it)
  persist    bytes of variables placed on the most loaded replica device
             (weights + optimizer state, from the graph's placement)
  opt/dev    bytes of optimizer state (every variable that is not a weight
             or global_step: AdamW's m and v) on the most loaded device
  w+g+o/dev  weights + gradients + optimizer state of the most loaded
             replica device, as `epl.tools.memory_estimate` counts them
             from the rewritten graph (gradients: the set the update reads,
             times 2 with micro-batches: the sum so far and the one added)
  formula    the same by DeepSpeed's formulas for the run's ZeRO level
             (`memory_estimate.zero_formula`; "none" and offload: off),
             with gradients counted twice with micro-batches as above
  step ms    median step time
  loss       the loss (mean over replicas) after the last step

Replica devices are /device:CPU:1..3 here, the devices off the host: on logical CPU devices the host CPU (where offload puts the state)
is also replica 0's device, /device:CPU:0, whose figures are printed on
their own.

    python benchmarks/memory_savers_zero.py [--config tiny] [--steps 8]
    python benchmarks/memory_savers_zero.py --smoke   # seconds: 2 layers, 3 steps

`--model mlp` measures ZeRO on an MLP of wide layers instead: peak host
memory and step time per level, each in a fresh process, optionally
against another source tree side by side (`benchmarks/zero_mlp.py`):

    python benchmarks/memory_savers_zero.py --model mlp --repeats 3 \
        [--compare_with /tmp/epl-before]
    python benchmarks/memory_savers_zero.py --model mlp --in_turn --steps 60
"""
import argparse
import logging
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow.compat.v1 as tf  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

import epl  # noqa: E402
from epl.tools import memory_estimate  # noqa: E402
from epl.tools import timeline  # noqa: E402
from epl.ir.graph_state import state_of  # noqa: E402
from epl.ir.op_types import VARIABLE_TYPES  # noqa: E402
from epl.parallel import engine  # noqa: E402
from benchmarks import zero_mlp  # noqa: E402
from examples.bert_large import train  # noqa: E402

DEVICES = 4
HOST = "/device:CPU:0"
RUNS = (
    ("none", {}),
    ("zero v0", {"EPL_ZERO_LEVEL": "v0"}),
    ("zero v1", {"EPL_ZERO_LEVEL": "v1"}),
    ("zero v2", {"EPL_ZERO_LEVEL": "v2"}),
    # Every variable partitioned: tiny BERT's matrices are under the
    # default zero.min_partition_size. (The word embeddings, a gather but
    # tied to the output layer, get a dense gradient.)
    ("zero v3", {"EPL_ZERO_LEVEL": "v3", "EPL_ZERO_MIN_PARTITION_SIZE": "0"}),
    ("offload v0", {"EPL_OFFLOAD_LEVEL": "v0"}),
    ("grouped apply 4", {"EPL_OPTIMIZER_NUM_APPLY_GROUP": "4"}),
    ("zero v1+offload+group", {"EPL_ZERO_LEVEL": "v1",
                               "EPL_OFFLOAD_LEVEL": "v0",
                               "EPL_OPTIMIZER_NUM_APPLY_GROUP": "4"}),
)
MIB = 1024.0 * 1024.0


def _variable_bytes(op):
  if op.type == "VarHandleOp":
    shape, dtype = op.get_attr("shape"), op.get_attr("dtype")
  else:
    shape, dtype = op.outputs[0].shape, op.outputs[0].dtype.base_dtype
  return tf.TensorShape(shape).num_elements() * tf.as_dtype(dtype).size


def _short_device(device):
  return "/device:" + device.rsplit("device:", 1)[-1] if device else HOST


def state_bytes(graph, weights):
  """({device: variable bytes}, {device: optimizer-state bytes})."""
  persistent, optimizer = {}, {}
  provenance = state_of(graph).provenance
  for op in graph.get_operations():
    if op.type not in VARIABLE_TYPES:
      continue
    device = _short_device(op.device)
    size = _variable_bytes(op)
    persistent[device] = persistent.get(device, 0) + size
    name = provenance.origin(op).source or op.name
    if name not in weights and name != "global_step":
      optimizer[device] = optimizer.get(device, 0) + size
  return persistent, optimizer


def _formula(stages, level, micro_batches):
  """Persistent bytes per device of the largest stage by
  `memory_estimate.zero_formula`, gradients counted as the estimate counts
  them (two sets with micro-batches)."""
  largest = max(stages, key=lambda s: s.parameters)
  sets = 2 if micro_batches > 1 else 1
  return memory_estimate.zero_formula(
      level, largest.parameters, DEVICES, largest.weight_bytes,
      largest.gradient_bytes * sets, largest.optimizer_bytes, micro_batches)


# Every run keeps a copy of the weights per replica, the layout of GPUs
# and workers the savers are for: on one host's CPUs EPL's default is one
# shared copy (communication.shared_weights), a layout of its own that
# benchmarks/data_parallel.py measures.
PER_REPLICA_WEIGHTS = {"EPL_COMMUNICATION_SHARED_WEIGHTS": "false"}


def measure(args, name, settings):
  """Trains one run; returns its figures."""
  settings = dict(PER_REPLICA_WEIGHTS, **settings)
  os.environ.update(settings)
  graph = tf.Graph()
  try:
    with graph.as_default():
      handles = train.build_graph(train.make_flags(
          config=args.config, batch_size=args.batch_size,
          seq_length=args.seq_length, parallel="data",
          num_micro_batch=args.num_micro_batch, num_layers=args.num_layers,
          num_cpu_devices=DEVICES, steps=100000, warmup_steps=10,
          learning_rate=1e-4, seed=1, dropout=False))
      logging.getLogger("epl").setLevel(logging.WARNING)
      result = engine.ensure_rewritten(graph)
      estimates = {_short_device(e.device): e
                   for e in memory_estimate.estimate(result)}
      stages = memory_estimate.zero_parameters(result)
      level = result.context.config.zero.level
      loss = result.substitutes.get(handles["loss"].name, handles["loss"])
      weights = {v.op.name for v in tf.trainable_variables()}
      init = tf.global_variables_initializer()
      with tf.Session() as session:
        session.run(init)
        times = []
        for _ in range(args.steps):
          start = time.perf_counter()
          last_loss = session.run([handles["train_op"], loss])[1]
          times.append(time.perf_counter() - start)
        metadata = tf.RunMetadata()
        session.run(handles["train_op"], options=tf.RunOptions(
            trace_level=tf.RunOptions.FULL_TRACE), run_metadata=metadata)
      peaks = {_short_device(d): p for d, p in
               timeline.peak_memory_per_device(metadata).items()}
      persistent, optimizer = state_bytes(graph, weights)
  finally:
    epl.shutdown()
    for key in settings:
      del os.environ[key]
  replica_devices = ["/device:CPU:%d" % d for d in range(1, DEVICES)]
  held = [estimates[d].parameters + estimates[d].optimizer_state +
          estimates[d].gradients * estimates[d].gradient_sets
          for d in replica_devices]
  return {
      "name": name,
      "held": max(held),
      "formula": _formula(stages, level, args.num_micro_batch),
      "peak": max(peaks.get(d, 0) for d in replica_devices),
      "persist": max(persistent.get(d, 0) for d in replica_devices),
      "opt": max(optimizer.get(d, 0) for d in replica_devices),
      "host peak": peaks.get(HOST, 0),
      "host persist": persistent.get(HOST, 0),
      "step": float(np.median(times[1:])) * 1000.0,
      "loss": float(last_loss),
  }


def report(results):
  base = results[0]
  columns = (("peak/dev MiB", "peak", MIB), ("persist MiB", "persist", MIB),
             ("opt/dev MiB", "opt", MIB), ("w+g+o/dev MiB", "held", MIB),
             ("formula MiB", "formula", MIB), ("step ms", "step", 1.0),
             ("loss", "loss", 1.0))
  header = ["run"] + ["%s (x none)" % title for title, _, _ in columns] + [
      "host peak/persist MiB"]
  print(" | ".join(["%-22s" % header[0]] + ["%21s" % h for h in header[1:]]))
  for row in results:
    cells = ["%-22s" % row["name"]]
    for _, key, scale in columns:
      ratio = row[key] / base[key] if base[key] else float("nan")
      cells.append("%13.3f (%5.2f)" % (row[key] / scale, ratio))
    cells.append("%21s" % ("%.1f / %.1f" % (row["host peak"] / MIB,
                                             row["host persist"] / MIB)))
    print(" | ".join(cells))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="tiny")
  parser.add_argument("--batch_size", type=int, default=8,
                      help="examples per replica and step")
  parser.add_argument("--seq_length", type=int, default=64)
  parser.add_argument("--steps", type=int, default=8)
  parser.add_argument("--num_micro_batch", type=int, default=2)
  parser.add_argument("--num_layers", type=int, default=0,
                      help="encoder layers (0: the preset's)")
  parser.add_argument("--smoke", action="store_true",
                      help="a seconds-long check that every run works: 2 "
                      "layers, sequence 16, batch 2, 3 steps")
  parser.add_argument("--runs", default="",
                      help="comma-separated run names (default: all)")
  parser.add_argument("--model", choices=("bert", "mlp"), default="bert")
  parser.add_argument("--layers", type=int, default=8,
                      help="mlp: dense blocks")
  parser.add_argument("--width", type=int, default=1024, help="mlp: width")
  parser.add_argument("--repeats", type=int, default=1,
                      help="mlp: runs of every row")
  parser.add_argument("--compare_with", default="",
                      help="mlp: another source tree to run side by side")
  parser.add_argument("--in_turn", action="store_true",
                      help="mlp: time the levels step by step in turn in "
                      "this process (their step times under the same "
                      "load; no peak memory) instead of fresh processes")
  args = parser.parse_args(argv)
  if args.model == "mlp":
    if args.smoke:
      args.layers, args.width, args.steps = 2, 256, 3
    return zero_mlp.run(args)
  if args.smoke:
    args.num_layers, args.seq_length, args.batch_size, args.steps = (
        2, 16, 2, 3)
  tf.disable_eager_execution()
  wanted = set(args.runs.split(",")) if args.runs else None
  runs = [(n, s) for n, s in RUNS if wanted is None or n in wanted or
          n == "none"]
  print("BERT-%s, %d data-parallel replicas on %d logical CPU devices, "
        "%d micro-batch(es) of %d x seq %d per replica, %d steps; "
        "TensorFlow %s" % (
            args.config, DEVICES, DEVICES, args.num_micro_batch,
            args.batch_size, args.seq_length, args.steps, tf.__version__))
  results = [measure(args, name, settings) for name, settings in runs]
  report(results)
  return 0


if __name__ == "__main__":
  sys.exit(main())
