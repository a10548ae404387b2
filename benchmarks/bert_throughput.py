"""Training throughput of BERT on 4 logical devices: EPL against TensorFlow.

For each BERT size (tiny by default; `--configs tiny,base` adds BERT-Base)
the same model, optimizer (AdamW, warm-up) and synthetic input train with
the same global batch per step in five runs:

  TF 1 device     plain TensorFlow on one device, one batch of G examples
  TF Mirrored     tf.distribute.MirroredStrategy over the 4 logical CPU
                  devices, in graph mode under a tf.compat.v1 Session
                  (call_for_each_replica; G/4 examples per replica)
  EPL data        EPL data parallelism, 4 replicas of G/4 examples (as
                  G/(4b) accumulated micro-batches of b when G > 4b),
                  gradients summed on one device (local sums, the default
                  on one host's CPUs), in communication.max_splits buckets
  EPL data ring   the same with collective ring all-reduce
                  (communication.local_cpu_reduce off), as across workers
  EPL pipeline    EPL pipeline of 4 stages (encoder layers split evenly),
                  M = G/b micro-batches of b examples
  EPL pipe+data   EPL 2 stages x 2 replicas, M = G/(2b) micro-batches

EPL's runs run as a user's script runs them: EPL initialised, its hooks
on at every Session.run, fetching the user's train op and loss (EPL swaps
in the loss merged over replicas and micro-batches); plain TF and
MirroredStrategy run without EPL. Every EPL and Mirrored run has the same micro-batch of b examples per device
and step (G/4 = b with the defaults). The runs are built one after the other
(build and rewrite times are printed), then timed step by step in turn, in
this process, so that any load on the machine hits them alike; with
`--sequential` (the default for base, to keep one model in memory at a
time) each run is built and timed in its own process, one after the other. examples/s = G / median
step time after the warm-up steps; ratios are against the one-device and
the Mirrored run of the same row.

The 4 logical CPU devices share this machine's cores: on a 2-core machine
the parallel runs cannot beat one device that already uses both cores for
each op; the ratios show what each way of splitting the work costs, not a
speed-up. The tiny model gets 4 encoder layers here (--tiny_layers) so that
a 4-stage pipeline has one layer per stage.

    python benchmarks/bert_throughput.py [--configs tiny,base] [--steps 10]
"""
import argparse
import contextlib
import json
import logging
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow.compat.v1 as tf  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

import epl  # noqa: E402
from epl.env import detached  # noqa: E402
from epl.parallel import engine  # noqa: E402
from benchmarks import bert_schedules  # noqa: E402
from benchmarks import mirrored  # noqa: E402
from benchmarks import smoke  # noqa: E402
from benchmarks import verdict  # noqa: E402
from examples.bert_large import input_pipeline  # noqa: E402
from examples.bert_large import modeling  # noqa: E402
from examples.bert_large import optimization  # noqa: E402
from examples.bert_large import train  # noqa: E402

DEVICES = 4
# --smoke (also auto_parallel's): a 2-layer tiny BERT of sequence 8 and
# vocabulary 100, one micro-batch of 1 per device, one timed step.
SMOKE = ["--configs", "tiny", "--steps", "1", "--warmup", "1",
         "--global_batch", "4", "--micro_batch", "1", "--seq_length", "8",
         "--vocab_size", "100", "--tiny_layers", "2"]
# This benchmark's smoke size runs the rows that need no 4 layers and no
# MirroredStrategy (startup.py's smoke size builds that, the slowest, and
# split_head.py's the ring).
SMOKE_RUNS = ["--runs", "TF 1 device,EPL data,EPL pipe+data"]
# Per-size defaults: sequence length, global batch G, micro-batch b.
SIZES = {
    "tiny": dict(seq_length=64, global_batch=32, micro_batch=8),
    "base": dict(seq_length=32, global_batch=8, micro_batch=2),
}


class Run:
  """One way of training: built into its own graph and session."""

  def __init__(self, name, parallel, replicas, stages, micro, epl_env=None):
    self.name, self.parallel = name, parallel
    # EPL_* settings this run is built with (environment, as the example
    # reads its EPL config from it).
    self.epl_env = epl_env or {}
    self.replicas, self.stages, self.micro = replicas, stages, micro
    self.session = self.train_op = self.loss = None
    self.build_s = self.rewrite_s = self.init_s = 0.0
    self.times = []
    self.first_loss = self.last_loss = float("nan")
    self.peak_rss_gib = 0.0

  @property
  def layout(self):
    return "%dx%dx%d" % (self.replicas, self.stages, self.micro)


def layers(args, size):
  """Encoder layers of `size` (0: its preset's): --tiny_layers for tiny,
  --base_layers for base."""
  return (args.tiny_layers if size == "tiny" else
          getattr(args, "base_layers", 0))


def _flags(args, size, run, batch):
  """The example's flags for `run` (Mirrored: those of plain TF)."""
  epl_run = run.parallel not in ("none", "mirrored")
  return train.make_flags(
      config=size, num_layers=layers(args, size),
      vocab_size=args.vocab_size,
      seq_length=args.seq_length or SIZES[size]["seq_length"],
      batch_size=batch, parallel=run.parallel if epl_run else "none",
      num_cpu_devices=DEVICES if epl_run else 0,
      num_micro_batch=run.micro, num_stages=run.stages,
      schedule=args.schedule, steps=100000, warmup_steps=10,
      learning_rate=1e-4, seed=1)


def _session_config(args, devices):
  config = tf.ConfigProto(device_count={"CPU": devices},
                          allow_soft_placement=True)
  config.intra_op_parallelism_threads = args.intra_op_threads
  config.inter_op_parallelism_threads = args.inter_op_threads
  return config


def build_train(args, size, run, batch, inspect=None):
  """Plain TF (`none`) or EPL: the example's own build_graph;
  `inspect(graph, handles)` sees the graph before EPL rewrites it."""
  graph = tf.Graph()
  with graph.as_default(), bert_schedules.environment(run.epl_env):
    start = time.perf_counter()
    handles = train.build_graph(_flags(args, size, run, batch))
    if inspect is not None:
      inspect(graph, handles)
  with graph.as_default():
    run.build_s = time.perf_counter() - start
    # The user's fetches: EPL swaps the loss merged over replicas and
    # micro-batches in for the loss at every run.
    run.train_op, run.loss = handles["train_op"], handles["loss"]
    if run.parallel != "none":
      # What the first Session.run would do, timed on its own.
      start = time.perf_counter()
      engine.ensure_rewritten(graph)
      run.rewrite_s = time.perf_counter() - start
    init = tf.global_variables_initializer()
    devices = DEVICES if run.parallel != "none" else 1
    run.session = tf.Session(config=_session_config(args, devices))
    start = time.perf_counter()
    run.session.run(init)
    run.init_s = time.perf_counter() - start


def mirrored_train_step(flags, devices):
  """(train op, loss) of the example's BERT, optimizer and input (resolved
  `flags`, batch_size per replica) under MirroredStrategy over `devices`
  logical CPU devices, built in the default graph."""
  bert_config = train.bert_config_from_flags(flags)
  tf.set_random_seed(flags.seed)
  dataset = input_pipeline.pretraining_dataset(
      "", flags.batch_size, flags.seq_length, flags.max_predictions_per_seq,
      vocab_size=bert_config.vocab_size, seed=flags.seed)
  # One iterator read by every replica: replica r takes the r-th batch.
  iterator = tf.data.make_one_shot_iterator(dataset)

  def replica_step(global_step):
    loss = modeling.build_pretraining_model(
        bert_config, iterator.get_next(),
        is_training=flags.dropout)["total_loss"]
    return loss, optimization.create_optimizer(
        loss, flags.learning_rate, flags.steps, flags.warmup_steps,
        weight_decay_rate=flags.weight_decay, global_step=global_step,
        add_summaries=False)

  return mirrored.train_step(
      ["/device:CPU:%d" % i for i in range(devices)], replica_step)


def build_mirrored(args, size, run, batch):
  """The same model, optimizer and input under MirroredStrategy."""
  flags = train.resolve_flags(_flags(args, size, run, batch))
  graph = tf.Graph()
  with graph.as_default():
    start = time.perf_counter()
    run.train_op, run.loss = mirrored_train_step(flags, DEVICES)
    run.build_s = time.perf_counter() - start
    init = tf.global_variables_initializer()
    run.session = tf.Session(config=_session_config(args, DEVICES))
    start = time.perf_counter()
    run.session.run(init)
    run.init_s = time.perf_counter() - start


def _without_epl(run):
  """The context `run`'s TensorFlow calls run in: plain TensorFlow and
  MirroredStrategy without EPL (`epl.env.detached`), EPL's runs with EPL
  on, as in a user's script."""
  if run.parallel in ("none", "mirrored"):
    return detached()
  return contextlib.nullcontext()


def start_run(args, size, run, inspect=None):
  """Builds, initialises and warms up `run`. EPL stays initialised with
  the run's config (the next EPL run's epl.init replaces it): the timed
  steps go through its hooks, as a user's do; `main` shuts it down."""
  g, b = args.global_batch or SIZES[size]["global_batch"], (
      args.micro_batch or SIZES[size]["micro_batch"])
  if run.parallel == "mirrored":
    # MirroredStrategy builds its replicas in threads of its own, which
    # `detached` (per thread) does not reach: EPL must be off.
    epl.shutdown()
  with _without_epl(run):
    if run.parallel == "mirrored":
      build_mirrored(args, size, run, g // DEVICES)
    elif run.parallel == "none":
      build_train(args, size, run, g)
    else:
      build_train(args, size, run, b, inspect)
    logging.getLogger("epl").setLevel(logging.WARNING)
    for step in range(args.warmup):
      loss = run.session.run([run.train_op, run.loss])[1]
      if step == 0:
        run.first_loss = float(loss)


def time_step(run):
  with _without_epl(run):
    start = time.perf_counter()
    run.last_loss = float(run.session.run([run.train_op, run.loss])[1])
    run.times.append(time.perf_counter() - start)


def runs_for(args, size):
  g = args.global_batch or SIZES[size]["global_batch"]
  b = args.micro_batch or SIZES[size]["micro_batch"]
  for name, parts in (("global batch", g), ("micro-batch", b)):
    if parts < 1:
      raise SystemExit("--%s must be positive" % name.replace(" ", "_"))
  if g % (DEVICES * b):
    raise SystemExit("global batch %d is not a multiple of %d devices x "
                     "micro-batch %d" % (g, DEVICES, b))
  runs = [Run("TF 1 device", "none", 1, 1, 1),
          Run("TF Mirrored", "mirrored", DEVICES, 1, 1),
          Run("EPL data", "data", DEVICES, 1, g // (DEVICES * b)),
          Run("EPL data ring", "data", DEVICES, 1, g // (DEVICES * b),
              {"EPL_COMMUNICATION_LOCAL_CPU_REDUCE": "false"}),
          Run("EPL pipeline", "pipeline", 1, DEVICES, g // b),
          Run("EPL pipe+data", "pipeline_data", 2, 2, g // (2 * b))]
  wanted = getattr(args, "runs", "")
  if not wanted:
    return runs
  names = wanted.split(",")
  unknown = set(names) - {run.name for run in runs}
  if unknown:
    raise SystemExit("--runs: unknown %s (known: %s)" % (
        sorted(unknown), ", ".join(run.name for run in runs)))
  return [run for run in runs if run.name in names]


_RESULT = "RUN RESULT "
_RESULT_FIELDS = ("build_s", "rewrite_s", "init_s", "times", "first_loss",
                  "last_loss", "peak_rss_gib")


def _peak_rss_gib():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def _in_subprocess(args, size, index):
  """Runs run `index` of `size` in a fresh process (so that its memory is
  given back before the next); returns its fields."""
  argv = [sys.executable, os.path.abspath(__file__), "--configs", size,
          "--run_index", str(index)] + [
              "--%s=%s" % (k, v) for k, v in sorted(vars(args).items())
              if k not in ("configs", "run_index", "sequential", "smoke")]
  proc = subprocess.run(argv, stdout=subprocess.PIPE, text=True,
                        check=False)
  lines = [l for l in proc.stdout.splitlines() if l.startswith(_RESULT)]
  if proc.returncode or not lines:
    raise SystemExit("run %d of %s failed (exit %d):\n%s" % (
        index, size, proc.returncode, proc.stdout[-3000:]))
  return json.loads(lines[-1][len(_RESULT):])


def _run_alone(args, size, run):
  """Child process: build, warm up and time one run; print its fields."""
  start_run(args, size, run)
  for _ in range(args.steps):
    time_step(run)
  run.session.close()
  run.peak_rss_gib = _peak_rss_gib()
  print(_RESULT + json.dumps({k: getattr(run, k) for k in _RESULT_FIELDS}),
        flush=True)


def measure(args, size):
  runs = runs_for(args, size)
  sequential = args.sequential or (args.sequential is None and size != "tiny")
  for index, run in enumerate(runs):
    if sequential:
      for key, value in _in_subprocess(args, size, index).items():
        setattr(run, key, value)
    else:
      start_run(args, size, run)
    print("  built %-15s build %6.1fs  rewrite %6.1fs  init %5.1fs%s" % (
        run.name, run.build_s, run.rewrite_s, run.init_s,
        "  (own process, peak RSS %.1f GiB)" % run.peak_rss_gib
        if sequential else ""), flush=True)
  if not sequential:
    time_in_turn(runs, args.steps)
  return runs, sequential


def time_in_turn(runs, steps):
  """Times `steps` steps of every run, one step of each in turn (so that
  load on the machine hits them alike), after one untimed step of each:
  a session's first step after other sessions were built in the process
  is as slow as a first step (22 s instead of 0.2 s for tiny BERT data
  parallel on a loaded 2-core machine, with or without EPL). Closes their
  sessions."""
  for run in runs:
    with _without_epl(run):
      run.session.run([run.train_op, run.loss])
  for _ in range(steps):
    for run in runs:
      time_step(run)
  for run in runs:
    run.session.close()


def print_timing(size, global_batch, sequential):
  print("%s: global batch %d, runs timed %s" % (
      size, global_batch, "one after the other (--sequential)" if sequential
      else "step by step in turn"))


def report(args, size, runs, sequential):
  g = args.global_batch or SIZES[size]["global_batch"]
  print_timing(size, g, sequential)
  print("examples/s: higher is better; vs = examples/s over that run's "
        "(higher is better), with whether EPL wins; spread = fastest-"
        "slowest step")
  header = ("run", "repl x stg x mb", "build s", "rewrite s", "step ms",
            "spread ms", "examples/s", "vs TF 1 dev", "EPL vs TF 1 dev",
            "vs Mirrored", "EPL vs Mirrored", "loss first/last")
  print(" | ".join(["%-15s" % header[0]] + ["%15s" % h for h in header[1:]]))
  rates = {}
  for run in runs:
    median = float(np.median(run.times))
    rates[run.name] = g / median
  for run in runs:
    rate = rates[run.name]
    versus = [verdict.ratio(rate, rates.get(anchor, 0))
              for anchor in ("TF 1 device", "TF Mirrored")]
    verdicts = [verdict.verdict(v) if run.name.startswith("EPL") else ""
                for v in versus]
    print(" | ".join([
        "%-15s" % run.name, "%15s" % run.layout, "%15.1f" % run.build_s,
        "%15.1f" % run.rewrite_s,
        "%15.1f" % (1e3 * g / rate),
        "%15s" % ("%.0f-%.0f" % (1e3 * min(run.times), 1e3 * max(run.times))),
        "%15.1f" % rate] + [
            "%15s" % item for v, word in zip(versus, verdicts)
            for item in ("-" if v != v else "%.2f" % v, word)] + [
                "%15s" % ("%.3f/%.3f" % (run.first_loss, run.last_loss))]),
          flush=True)


def add_arguments(parser):
  """The options of the BERT benchmarks (this one and auto_parallel)."""
  parser.add_argument("--configs", default="tiny",
                      help="comma separated: tiny, base")
  parser.add_argument("--steps", type=int, default=10,
                      help="timed steps per run")
  parser.add_argument("--warmup", type=int, default=3,
                      help="steps before timing (the first runs Grappler)")
  parser.add_argument("--global_batch", type=int, default=0,
                      help="examples per step, G (0: 32 tiny, 8 base)")
  parser.add_argument("--micro_batch", type=int, default=0,
                      help="examples per device and micro-batch, b (0: 8 "
                           "tiny, 2 base)")
  parser.add_argument("--seq_length", type=int, default=0,
                      help="0: 64 tiny, 32 base")
  parser.add_argument("--tiny_layers", type=int, default=4,
                      help="encoder layers of the tiny model")
  parser.add_argument("--base_layers", type=int, default=0,
                      help="encoder layers of the base model (0: its 12)")
  parser.add_argument("--vocab_size", type=int, default=0,
                      help="vocabulary size (0: the preset's)")
  parser.add_argument("--schedule", default="PreferBackward",
                      choices=["PreferBackward", "PreferForward"])
  parser.add_argument("--sequential", dest="sequential", action="store_true",
                      default=None, help="build and time the runs one "
                      "after the other, one model in memory at a time "
                      "(default for base)")
  parser.add_argument("--interleaved", dest="sequential",
                      action="store_false", help="time all runs in turn "
                      "(default for tiny)")
  parser.add_argument("--intra_op_threads", type=int, default=0,
                      help="0: TensorFlow's default")
  parser.add_argument("--inter_op_threads", type=int, default=0,
                      help="0: TensorFlow's default")


def configured_sizes(args):
  """The BERT sizes of --configs (checked), with TensorFlow set up for the
  graph-mode runs."""
  tf.disable_eager_execution()
  tf.logging.set_verbosity(tf.logging.ERROR)
  sizes = [s.strip() for s in args.configs.split(",") if s.strip()]
  for size in sizes:
    if size not in SIZES:
      raise SystemExit("--configs: %r is not one of %s" % (size,
                                                          sorted(SIZES)))
  return sizes


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_arguments(parser)
  parser.add_argument("--runs", default="",
                      help="comma-separated run names (default: all six)")
  parser.add_argument("--run_index", type=int, default=-1,
                      help=argparse.SUPPRESS)  # child process of --sequential
  args = smoke.parse_args(parser, argv, SMOKE + SMOKE_RUNS)
  sizes = configured_sizes(args)
  if args.run_index >= 0:
    _run_alone(args, sizes[0], runs_for(args, sizes[0])[args.run_index])
    return 0
  print("BERT throughput on %d logical CPU devices; %d CPU cores; "
        "TensorFlow %s; %d timed steps (median) after %d warm-up steps; "
        "session threads intra-op %s, inter-op %s; schedule %s" % (
            DEVICES, os.cpu_count(), tf.__version__, args.steps,
            args.warmup, args.intra_op_threads or "default",
            args.inter_op_threads or "default", args.schedule))
  print("repl x stg x mb = replicas x pipeline stages x micro-batches per "
        "step; vs = examples/s over that run's examples/s")
  for size in sizes:
    seq = args.seq_length or SIZES[size]["seq_length"]
    print("\n%s BERT: %d layers, sequence %d, global batch %d, micro-batch "
          "%d per device" % (size, layers(args, size) or (
              modeling.BertConfig.from_name(size).num_hidden_layers), seq,
                             args.global_batch or SIZES[size]["global_batch"],
                             args.micro_batch or SIZES[size]["micro_batch"]),
          flush=True)
    start = time.perf_counter()
    runs, sequential = measure(args, size)
    report(args, size, runs, sequential)
    print("(%s took %.0fs; peak RSS of this process so far %.1f GiB)" % (
        size, time.perf_counter() - start, _peak_rss_gib()), flush=True)
  epl.shutdown()
  return 0


if __name__ == "__main__":
  sys.exit(main())
