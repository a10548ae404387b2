"""ZeRO on an MLP of wide layers: peak host memory and step time per
level, each row in a fresh process (`memory_savers_zero.py --model mlp`).

The model: `--layers` blocks of dense `--width` x `--width` (+ bias,
ReLU), Adam, data parallel over 4 logical CPU devices, `--batch_size`
examples per replica. All logical CPU devices share the process's
allocator, so the figure that says what a level saves is the allocator's
peak during the timed steps (TF_CPU_ALLOCATOR_USE_BFC=true;
`get_memory_info("CPU:0")["peak"]` after `reset_memory_stats`): weights,
optimizer state, gradients, gathered weights and activations of every
replica together.

With `--compare_with DIR` every row also runs with the EPL of another
source tree (say, a checkout of the commit before a change, with this
benchmark's files copied in: each row runs DIR's script), the two
interleaved row by row and `--repeats` times, so that both see the same
load on a shared machine; the table gives the median and the spread
(min-max) of each figure. Step times are the median and the best of
the timed steps: on a loaded machine the best says more about the
step's own cost.
"""
import os
import statistics
import sys
import time

# get_memory_info("CPU:0") has no figures without the BFC allocator.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow.compat.v1 as tf  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

import epl  # noqa: E402
from benchmarks import fresh_process  # noqa: E402

# With every replica a CPU device of this process, the plan's
# communication is local sums (v3 gathers by one concatenation per use);
# "v3 rings" asks for TensorFlow's collectives (CollectiveGatherV2).
LEVELS = (("none", {}), ("zero v1", {"zero.level": "v1"}),
          ("zero v2", {"zero.level": "v2"}),
          ("zero v3", {"zero.level": "v3"}),
          ("v3 rings", {"zero.level": "v3",
                        "communication.local_cpu_reduce": False}))
DEVICES = 4
MIB = 1024.0 * 1024.0


def _model(layers, width, batch):
  """The loss of the MLP on one fixed synthetic batch."""
  rng = np.random.RandomState(0)
  x = rng.normal(size=(batch, width)).astype("float32")
  y = rng.normal(size=(batch, 1)).astype("float32")
  features, labels = tf.data.Dataset.from_tensors((x, y)).repeat() \
      .make_one_shot_iterator().get_next()
  hidden = features
  for index in range(layers):
    hidden = tf.layers.dense(
        hidden, width, activation=tf.nn.relu, name="block_%d" % index,
        kernel_initializer=tf.glorot_uniform_initializer(seed=index))
  output = tf.layers.dense(hidden, 1, name="head")
  return tf.reduce_mean(tf.square(output - labels))


def measure(settings, layers, width, batch, steps):
  """One row, in this process: {peak, step (median s), best, cpu (median
  process CPU s a step), steps (s each)}."""
  tf.disable_eager_execution()
  epl.init(epl.Config(dict(settings, **{
      "cluster.num_cpu_devices": DEVICES})))
  epl.set_default_strategy(epl.replicate(device_count=1))
  with tf.Graph().as_default():
    loss = _model(layers, width, batch)
    train_op = tf.train.AdamOptimizer(1e-4).minimize(loss)
    with tf.Session() as session:
      session.run(tf.global_variables_initializer())
      for _ in range(2):
        session.run(train_op)
      tf.config.experimental.reset_memory_stats("CPU:0")
      times, cpu = [], []
      for _ in range(steps):
        start, start_cpu = time.perf_counter(), time.process_time()
        session.run(train_op)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
      peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
  return {"peak": peak, "step": statistics.median(times), "best": min(times),
          "cpu": statistics.median(cpu), "steps": times}


def _row(source, name, settings, args):
  """One row in a fresh process running `source`'s copy of the benchmark
  (which imports `source`'s EPL)."""
  script = os.path.join(source, "benchmarks", "zero_mlp.py")
  result = fresh_process.measure_in_child(
      script, [settings, args.layers, args.width, args.batch_size,
               args.steps], timeout=1800)
  print("  %-10s %-8s peak %8.1f MiB, step %7.1f ms (best %7.1f), CPU "
        "%7.1f ms a step" % (
            os.path.basename(source.rstrip("/")), name, result["peak"] / MIB,
            result["step"] * 1000, result["best"] * 1000,
            result.get("cpu", float("nan")) * 1000), flush=True)
  return result


def _spread(values, scale):
  return "%.1f (%.1f-%.1f)" % (statistics.median(values) / scale,
                               min(values) / scale, max(values) / scale)


def _ratios(rows, name, base, key):
  """rows[name][i][key] / rows[base][i][key] of each repeat i (NaN where
  a tree's benchmark did not measure `key`)."""
  return [r.get(key, float("nan")) / b.get(key, float("nan"))
          for b, r in zip(rows[base], rows[name])]


def report(sources, names, results):
  """One table per source: median (min-max) over the repeats of the peak,
  the median and the best step, the CPU time a step, peak(none) / peak,
  and the median and best step and the CPU time over v2's of the same
  repeat (the machine's load changes between repeats)."""
  for source in sources:
    print("\nEPL from %s" % source)
    print(" | ".join(["%-8s" % "run", "%-22s" % "peak MiB",
                      "%-22s" % "step ms (median)", "%-22s" % "step ms (best)",
                      "%-22s" % "CPU ms a step",
                      "%-18s" % "less peak than none",
                      "%-18s" % "step / v2 (median)",
                      "%-18s" % "step / v2 (best)", "%-18s" % "CPU / v2"]))
    rows = results[source]
    for name in names:
      less = [1.0 / r for r in _ratios(rows, name, "none", "peak")]
      print(" | ".join([
          "%-8s" % name,
          "%-22s" % _spread([r["peak"] for r in rows[name]], MIB),
          "%-22s" % _spread([r["step"] for r in rows[name]], 0.001),
          "%-22s" % _spread([r["best"] for r in rows[name]], 0.001),
          "%-22s" % _spread([r.get("cpu", float("nan"))
                             for r in rows[name]], 0.001),
          "%-18s" % (_spread(less, 1.0) + "x"),
          "%-18s" % (_spread(_ratios(rows, name, "zero v2", "step"),
                             1.0) + "x"),
          "%-18s" % (_spread(_ratios(rows, name, "zero v2", "best"),
                             1.0) + "x"),
          "%-18s" % (_spread(_ratios(rows, name, "zero v2", "cpu"),
                             1.0) + "x")]))


def main(args):
  """Every level with this tree's EPL (and `args.compare_with`'s),
  interleaved, `args.repeats` times; prints the tables."""
  sources = [ROOT] + ([args.compare_with] if args.compare_with else [])
  print("MLP %d x %dx%d, Adam, %d replicas on %d logical CPU devices, batch "
        "%d per replica, %d timed steps, %d repeat(s)" % (
            args.layers, args.width, args.width, DEVICES, DEVICES,
            args.batch_size, args.steps, args.repeats), flush=True)
  # "none" and "zero v2" always run: the ratios are to them.
  wanted = set(args.runs.split(",") + ["none", "zero v2"]) if args.runs \
      else {name for name, _ in LEVELS}
  levels = [(name, settings) for name, settings in LEVELS if name in wanted]
  results = {source: {name: [] for name, _ in levels} for source in sources}
  for _ in range(args.repeats):
    for name, settings in levels:
      for source in sources:
        results[source][name].append(
            _row(source, name, settings, args))
  report(sources, [name for name, _ in levels], results)
  return 0


if __name__ == "__main__":
  if len(sys.argv) == 3 and sys.argv[1] == "--child":
    fresh_process.answer_child(sys.argv[2], measure)
  else:
    sys.exit("run it as benchmarks/memory_savers_zero.py --model mlp")
