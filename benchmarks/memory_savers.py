"""What each memory saver saves: BERT data parallel on logical CPU devices,
each saver alone and combined, against the same run without savers.

One process runs every row of SAVERS in turn on the same model, devices
and batches (BERT from examples/bert_large, data parallel over
--replicas logical CPU devices, dropout off, synthetic input). Each row:

  1. builds the training graph with the row's EPL config (through the
     EPL_<SECTION>_<KEY> environment variables, which the example's
     epl.Config reads), initialises, runs --warmup steps;
  2. traces one step and measures per device, with
     epl.tools.memory_profiler_hook.profile_memory: persistent bytes
     (weights, replicas' copies, optimizer slots) and peak bytes
     (persistent + the step's high-water mark from the allocation
     records); the table shows the largest device;
  3. times --timed steps (median seconds per step);
  4. reports the loss after --warmup + 1 + --timed steps.

Every figure is also printed as a ratio to the "none" row (the first).

    python benchmarks/memory_savers.py                      # every row
    python benchmarks/memory_savers.py --savers none,gc_auto --num_layers 8
    python benchmarks/memory_savers.py --savers none,amp_o1 --num_layers 2 \
        --seq_length 64 --batch_size 4     # float16 on CPU: slow

Other savers add their rows to SAVERS (name -> EPL config keys).
"""
import argparse
import collections
import logging
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow.compat.v1 as tf  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

import epl  # noqa: E402
from benchmarks import smoke  # noqa: E402
from epl.config import key_info  # noqa: E402
from epl.tools.memory_profiler_hook import profile_memory  # noqa: E402
from examples.bert_large import train  # noqa: E402

# Row name -> EPL config keys of the savers it turns on.
SAVERS = collections.OrderedDict([
    ("none", {}),
    ("gc_auto", {"gradient_checkpoint.type": "auto"}),
    ("amp_o1", {"amp.level": "O1"}),
    ("amp_o1_bf16", {"amp.level": "O1", "amp.dtype": "bfloat16"}),
    ("gc_auto+amp_o1", {"gradient_checkpoint.type": "auto",
                        "amp.level": "O1"}),
    ("gc_auto+amp_o1_bf16", {"gradient_checkpoint.type": "auto",
                             "amp.level": "O1", "amp.dtype": "bfloat16"}),
    ("zero_v1", {"zero.level": "v1"}),
    ("gc_auto+zero_v1+amp_o1_bf16", {"gradient_checkpoint.type": "auto",
                                     "zero.level": "v1", "amp.level": "O1",
                                     "amp.dtype": "bfloat16"}),
])
# float16 kernels on CPU are emulated (about 80x slower than float32 on this
# machine's BERT-tiny): without a GPU these rows run only when asked for.
FLOAT16_ROWS = ("amp_o1", "gc_auto+amp_o1")
COLUMNS = ("peak", "persistent", "step_s", "loss")
MIB = 2.0 ** 20
SMOKE = ["--savers", "none,gc_auto", "--num_layers", "1", "--seq_length",
         "8", "--batch_size", "1", "--replicas", "2", "--warmup", "1",
         "--timed", "1"]


def _set_environment(keys):
  """Sets the row's keys as EPL_<SECTION>_<KEY>; returns what to undo."""
  previous = {}
  for key, value in keys.items():
    variable = key_info(key).env_var
    previous[variable] = os.environ.get(variable)
    os.environ[variable] = str(value)
  return previous


def _restore_environment(previous):
  for variable, value in previous.items():
    if value is None:
      os.environ.pop(variable, None)
    else:
      os.environ[variable] = value


# Every row keeps a copy of the weights per replica, the layout of GPUs
# and workers the savers are for: on one host's CPUs EPL's default is one
# shared copy (communication.shared_weights), a layout of its own that
# benchmarks/data_parallel.py measures.
PER_REPLICA_WEIGHTS = {"communication.shared_weights": False}


def measure(keys, args):
  """{column: value} of one row."""
  previous = _set_environment(dict(PER_REPLICA_WEIGHTS, **keys))
  try:
    graph = tf.Graph()
    with graph.as_default():
      built = train.build_graph(train.make_flags(
          config=args.config, num_layers=args.num_layers, parallel="data",
          num_cpu_devices=args.replicas, batch_size=args.batch_size,
          seq_length=args.seq_length, dropout=False, steps=1000))
      logging.getLogger("epl").setLevel(logging.WARNING)
      fetches = [built["train_op"], built["loss"]]
      with tf.Session() as session:
        session.run(tf.global_variables_initializer())
        for _ in range(args.warmup):
          session.run(fetches)
        metadata = tf.RunMetadata()
        session.run(fetches, options=tf.RunOptions(
            trace_level=tf.RunOptions.FULL_TRACE), run_metadata=metadata)
        memory = profile_memory(metadata, graph, visualize=False)
        seconds = []
        for _ in range(args.timed):
          start = time.perf_counter()
          _, loss = session.run(fetches)
          seconds.append(time.perf_counter() - start)
    return {"peak": max(m.peak for m in memory),
            "persistent": max(m.persistent for m in memory),
            "step_s": statistics.median(seconds), "loss": float(loss)}
  finally:
    epl.shutdown()
    _restore_environment(previous)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--savers", default="",
                      help="comma-separated rows of SAVERS (default: all; "
                      "without a GPU, all but %s)" % ", ".join(FLOAT16_ROWS))
  parser.add_argument("--config", default="tiny")
  parser.add_argument("--num_layers", type=int, default=6)
  parser.add_argument("--replicas", type=int, default=4)
  parser.add_argument("--batch_size", type=int, default=16,
                      help="examples per replica")
  parser.add_argument("--seq_length", type=int, default=128)
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--timed", type=int, default=5)
  args = smoke.parse_args(parser, argv, SMOKE)
  tf.disable_eager_execution()
  if args.savers:
    names = args.savers.split(",")
  else:
    gpu = bool(tf.config.list_physical_devices("GPU"))
    names = [n for n in SAVERS if gpu or n not in FLOAT16_ROWS]
  if names[0] != "none":
    names.insert(0, "none")
  print("BERT %s, %d layers, seq %d, %d examples per replica, %d "
        "data-parallel replicas on logical CPU devices; TensorFlow %s" % (
            args.config, args.num_layers, args.seq_length, args.batch_size,
            args.replicas, tf.__version__))
  results = collections.OrderedDict()
  for name in names:
    results[name] = measure(SAVERS[name], args)
    print("measured %-16s %s" % (name, results[name]), flush=True)
  base = results["none"]
  header = ("saver", "peak MiB", "persist MiB", "step s", "loss",
            "peak x", "persist x", "step x", "loss x")
  print(" | ".join("%14s" % h for h in header))
  for name, row in results.items():
    cells = [name, "%.2f" % (row["peak"] / MIB),
             "%.2f" % (row["persistent"] / MIB), "%.3f" % row["step_s"],
             "%.4f" % row["loss"]]
    cells += ["%.3f" % (row[c] / base[c]) for c in COLUMNS]
    print(" | ".join("%14s" % c for c in cells))
  print("x: ratio to the run without savers (peak, persistent: the largest "
        "device; step: median seconds; loss: after %d steps)" % (
            args.warmup + 1 + args.timed))
  return 0


if __name__ == "__main__":
  sys.exit(main())
