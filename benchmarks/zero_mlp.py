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
the timed steps. Each row also gives the cores other processes kept
busy while it ran (`host_load`): on 2 cores shared with other jobs a
step that keeps both busy takes about half its CPU time when nothing
else runs and all of it when another process holds a core, so wall
times of two rows compare only where that figure is alike.

With `--in_turn` the levels are built in one process and timed step by
step in turn instead (no peak memory: they share the allocator); each
level's step over v2's is taken round by round, steps a few tens of
milliseconds apart, so the load from other processes hits both alike.
"""
import functools
import os
import statistics
import sys

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
from benchmarks import host_load  # noqa: E402
from benchmarks import in_turn  # noqa: E402

# With every replica a CPU device of this process, the plan's
# communication is local sums (v3 gathers by one concatenation per use);
# "v3 rings" asks for TensorFlow's collectives (CollectiveGatherV2).
# "v3 ahead k" starts each gather k uses ahead (zero.prefetch_layers).
# "none" shares one copy of the weights and optimizer state among the
# replicas (communication.shared_weights, with local sums); "copies" is
# no ZeRO with a copy on every replica, as without local sums.
LEVELS = (("none", {}),
          ("copies", {"communication.shared_weights": False}),
          ("zero v1", {"zero.level": "v1"}),
          ("zero v2", {"zero.level": "v2"}),
          ("zero v3", {"zero.level": "v3"}),
          ("v3 ahead 2", {"zero.level": "v3", "zero.prefetch_layers": 2}),
          ("v3 ahead 3", {"zero.level": "v3", "zero.prefetch_layers": 3}),
          ("v3 rings", {"zero.level": "v3",
                        "communication.local_cpu_reduce": False}))
DEVICES = 4
# Other processes' cores under which a round of `--in_turn` counts as quiet.
QUIET = 0.1
# Issue 35's goal for v3's step, over v2's.
GOAL = 1.15
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


def _built(settings, layers, width, batch):
  """(session, train op) of the MLP in a graph of its own under EPL with
  `settings`, initialised (the graph keeps its config when a later
  epl.init changes EPL's)."""
  tf.disable_eager_execution()
  epl.init(epl.Config(dict(settings, **{
      "cluster.num_cpu_devices": DEVICES})))
  epl.set_default_strategy(epl.replicate(device_count=1))
  graph = tf.Graph()
  with graph.as_default():
    loss = _model(layers, width, batch)
    train_op = tf.train.AdamOptimizer(1e-4).minimize(loss)
    init = tf.global_variables_initializer()
  session = tf.Session(graph=graph)
  session.run(init)
  return session, train_op


def measure(settings, layers, width, batch, steps):
  """One row, in this process: {peak, step (median s), best, cpu (median
  process CPU s a step), others (cores other processes kept busy meanwhile,
  `host_load`), steps (s each)}."""
  session, train_op = _built(settings, layers, width, batch)
  with session:
    for _ in range(2):
      session.run(train_op)
    tf.config.experimental.reset_memory_stats("CPU:0")
    others = host_load.OtherProcesses()
    times, cpu = zip(*[in_turn.timed_step(lambda: session.run(train_op))
                       for _ in range(steps)])
    others = others.cores()
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
  return {"peak": peak, "step": statistics.median(times), "best": min(times),
          "cpu": statistics.median(cpu), "others": others,
          "steps": list(times)}


def _in_turn_table(timed, quiet):
  """Prints each run's median and best step, CPU a step, and its step and
  CPU over v2's (median over the rounds, and over the quiet ones); then
  whether each v3 run meets GOAL."""
  print(" | ".join(["%-10s" % "run", "%-16s" % "step ms (median)",
                    "%-14s" % "step ms (best)", "%-13s" % "CPU ms a step",
                    "%-18s" % "step / v2 (median)",
                    "%-17s" % "CPU / v2 (median)",
                    "step / v2 (quiet rounds)"]))
  base = timed["zero v2"]
  steps = {}
  for name, pairs in timed.items():
    walls, cpus = zip(*pairs)
    ratios = [w / b[0] for (w, _), b in zip(pairs, base)]
    calm = [r for r, q in zip(ratios, quiet) if q]
    steps[name] = statistics.median(ratios)
    print(" | ".join([
        "%-10s" % name, "%-16.1f" % (statistics.median(walls) * 1000),
        "%-14.1f" % (min(walls) * 1000),
        "%-13.1f" % (statistics.median(cpus) * 1000),
        "%-18s" % ("%.2fx" % steps[name]),
        "%-17s" % ("%.2fx" % in_turn.median_ratio(pairs, base, 1)),
        "%.2fx" % statistics.median(calm) if calm else "no quiet round"]))
  for name, step in steps.items():
    if "v3" in name:
      print("%s: step %.2fx v2's (lower is better; goal at most %.2fx): %s"
            % (name, step, GOAL, "meets" if step <= GOAL else "misses"))


def time_in_turn(levels, args):
  """Every level of `levels` built in this process, then timed step by
  step in turn (each round starting one level later), so that load from
  other processes hits them alike; prints each level's median and best
  step, its CPU time a step, and the median over the rounds of its step
  and CPU time over v2's of the same round; and the step over v2's over
  the quiet rounds alone (other processes kept under QUIET cores busy:
  both cores were this process's)."""
  runs = [(name,) + _built(settings, args.layers, args.width,
                           args.batch_size) for name, settings in levels]
  # A session's first steps after other sessions were built are slow.
  for _, session, train_op in runs:
    for _ in range(2):
      session.run(train_op)
  load = os.getloadavg()[0]
  timed, quiet, others = in_turn.rounds(
      [(name, functools.partial(session.run, train_op))
       for name, session, train_op in runs], args.steps, QUIET)
  for _, session, _ in runs:
    session.close()
  print("timed in turn, %d rounds, %d of them quiet (other processes under "
        "%.2f cores); load average %.1f at the start, %.1f at the end; "
        "other processes kept %s cores busy" % (
            args.steps, sum(quiet), QUIET, load, os.getloadavg()[0],
            "n/a" if others is None else "%.2f" % others))
  _in_turn_table(timed, quiet)


def _row(source, name, settings, args):
  """One row in a fresh process running `source`'s copy of the benchmark
  (which imports `source`'s EPL)."""
  script = os.path.join(source, "benchmarks", "zero_mlp.py")
  result = fresh_process.measure_in_child(
      script, [settings, args.layers, args.width, args.batch_size,
               args.steps], timeout=1800)
  others = result.get("others")
  print("  %-10s %-10s peak %8.1f MiB, step %7.1f ms (best %7.1f), CPU "
        "%7.1f ms a step, other processes %s cores, load %.1f" % (
            os.path.basename(source.rstrip("/")), name, result["peak"] / MIB,
            result["step"] * 1000, result["best"] * 1000,
            result.get("cpu", float("nan")) * 1000,
            "n/a" if others is None else "%.2f" % others, os.getloadavg()[0]),
        flush=True)
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
  the median and the best step, the CPU time a step, peak(none) / peak
  and peak(copies) / peak (where "copies" ran),
  and the median and best step and the CPU time over v2's of the same
  repeat (the machine's load changes between repeats), and the cores
  other processes kept busy meanwhile (wall times compare only where
  those are alike)."""
  for source in sources:
    print("\nEPL from %s" % source)
    print(" | ".join(["%-10s" % "run", "%-22s" % "peak MiB",
                      "%-22s" % "step ms (median)", "%-22s" % "step ms (best)",
                      "%-22s" % "CPU ms a step",
                      "%-18s" % "less peak than none",
                      "%-18s" % "than copies",
                      "%-18s" % "step / v2 (median)",
                      "%-18s" % "step / v2 (best)", "%-18s" % "CPU / v2",
                      "other processes' cores"]))
    rows = results[source]
    for name in names:
      less = [1.0 / r for r in _ratios(rows, name, "none", "peak")]
      less_copies = [1.0 / r for r in _ratios(rows, name, "copies", "peak")
                     ] if "copies" in rows else [float("nan")]
      print(" | ".join([
          "%-10s" % name,
          "%-22s" % _spread([r["peak"] for r in rows[name]], MIB),
          "%-22s" % _spread([r["step"] for r in rows[name]], 0.001),
          "%-22s" % _spread([r["best"] for r in rows[name]], 0.001),
          "%-22s" % _spread([r.get("cpu", float("nan"))
                             for r in rows[name]], 0.001),
          "%-18s" % (_spread(less, 1.0) + "x"),
          "%-18s" % (_spread(less_copies, 1.0) + "x"),
          "%-18s" % (_spread(_ratios(rows, name, "zero v2", "step"),
                             1.0) + "x"),
          "%-18s" % (_spread(_ratios(rows, name, "zero v2", "best"),
                             1.0) + "x"),
          "%-18s" % (_spread(_ratios(rows, name, "zero v2", "cpu"),
                             1.0) + "x"),
          _spread([float("nan") if r.get("others") is None else r["others"]
                   for r in rows[name]], 1.0)]))


def run(args):
  """Every level with this tree's EPL (and `args.compare_with`'s),
  interleaved, `args.repeats` times; prints the tables (with
  `args.in_turn`, `time_in_turn` instead)."""
  sources = [ROOT] + ([args.compare_with] if args.compare_with else [])
  print("MLP %d x %dx%d, Adam, %d replicas on %d logical CPU devices, batch "
        "%d per replica, %d timed steps, %d repeat(s)" % (
            args.layers, args.width, args.width, DEVICES, DEVICES,
            args.batch_size, args.steps, args.repeats), flush=True)
  # "none" and "zero v2" always run: the ratios are to them.
  wanted = set(args.runs.split(",") + ["none", "zero v2"]) if args.runs \
      else {name for name, _ in LEVELS}
  levels = [(name, settings) for name, settings in LEVELS if name in wanted]
  if args.in_turn:
    time_in_turn(levels, args)
    return 0
  results = {source: {name: [] for name, _ in levels} for source in sources}
  for _ in range(args.repeats):
    for name, settings in levels:
      for source in sources:
        results[source][name].append(
            _row(source, name, settings, args))
  report(sources, [name for name, _ in levels], results)
  return 0


def main(argv=None):
  """`memory_savers_zero.py --model mlp` with `argv` (benchmarks.all runs
  this module by its name)."""
  # It imports this module: imported here, not at the top.
  from benchmarks import memory_savers_zero  # pylint: disable=import-outside-toplevel
  return memory_savers_zero.main(["--model", "mlp"] + list(
      sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
  if len(sys.argv) == 3 and sys.argv[1] == "--child":
    fresh_process.answer_child(sys.argv[2], measure)
  else:
    sys.exit(main())
