"""Auto parallel against hand-annotated stages: BERT pipelines on 4 logical
devices.

For each BERT size (tiny by default, with 4 encoder layers; `--configs
base` for BERT-Base, 12 layers) and each stage count K (2 and 4), two runs
train the same model, optimizer and synthetic input with the same global
batch G:

  hand K    the example's `--parallel pipeline`: embeddings and input in
            stage 0, encoder layers split evenly, heads and loss in the last
            stage (epl.replicate scopes written in examples/bert_large)
  auto K    the example's `--parallel auto`: no annotation,
            auto.auto_parallel with pipeline.num_stages = K

Both have 4 / K replicas and M = G / (replicas x b) micro-batches of b
examples. For each run the table gives the pipeline bubble bound
(K-1)/(M+K-1), the forward FLOPs of each stage per micro-batch (static
count, `epl.parallel.cost.flops`) with their most/fewest ratio, and examples/s
(G / median step time). The runs of one size are built one after the
other, then timed step by step in turn in this process, so that load on the
machine hits them alike; `--sequential` builds and times one run at a time
(BERT-Base's default, to hold one model in memory at a time).

The logical devices share this machine's cores: on 2 cores a pipeline
cannot beat one device; the figures compare two ways of cutting the same
pipeline, not a speed-up.

    python benchmarks/auto_parallel.py [--configs tiny,base] [--steps 10]
"""
import argparse
import functools
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
from benchmarks import bert_throughput  # noqa: E402
from benchmarks import smoke  # noqa: E402
from epl.parallel.cost import flops  # noqa: E402
from epl.ir import graph_editor  # noqa: E402
from epl.ir.graph_state import state_of  # noqa: E402
from epl.ir.phase import Phase  # noqa: E402
from examples.bert_large import train  # noqa: E402

DEVICES = bert_throughput.DEVICES
SIZES = bert_throughput.SIZES
STAGE_COUNTS = (2, 4)


class Run(bert_throughput.Run):
  """One pipeline: hand-annotated or auto, with its stages' FLOPs."""

  def __init__(self, name, parallel, stages, global_batch, micro_batch):
    replicas = DEVICES // stages
    super().__init__(name, parallel, replicas, stages,
                     global_batch // (replicas * micro_batch))
    self.stage_flops = []

  @property
  def bubble(self):
    return (self.stages - 1) / (self.micro + self.stages - 1)

  @property
  def flops_ratio(self):
    return max(self.stage_flops) / max(min(self.stage_flops), 1)


def _record_stage_flops(run, graph, handles):
  """Keeps the static forward FLOPs of each TaskGraph for one micro-batch
  on `run`: the ops the loss computes from, before the rewrite copies
  them."""
  state = state_of(graph)
  forward = [op for op in graph_editor.ancestors([handles["loss"].op])
             if state.phase_of(op) is Phase.FORWARD]
  costs = flops.taskgraph_costs(graph, forward)
  run.stage_flops = [costs[index].flops for index in sorted(
      i for i in costs if i is not None)]


def runs_for(args, size):
  """The hand and auto runs of every stage count of --stage_counts."""
  g = args.global_batch or SIZES[size]["global_batch"]
  b = args.micro_batch or SIZES[size]["micro_batch"]
  if g % (DEVICES * b):
    raise SystemExit("global batch %d is not a multiple of %d devices x "
                     "micro-batch %d" % (g, DEVICES, b))
  runs = []
  for stages in (int(k) for k in args.stage_counts.split(",")):
    runs.append(Run("hand %d" % stages, "pipeline", stages, g, b))
    runs.append(Run("auto %d" % stages, "auto", stages, g, b))
  return runs


def measure(args, size):
  runs = runs_for(args, size)
  sequential = args.sequential or (args.sequential is None and size != "tiny")
  for run in runs:
    bert_throughput.start_run(args, size, run, functools.partial(
        _record_stage_flops, run))
    print("  built %-7s build %6.1fs  rewrite %6.1fs  init %5.1fs" % (
        run.name, run.build_s, run.rewrite_s, run.init_s), flush=True)
    if sequential:
      for _ in range(args.steps):
        bert_throughput.time_step(run)
      run.session.close()
  if not sequential:
    bert_throughput.time_in_turn(runs, args.steps)
  return runs, sequential


def report(args, size, runs, sequential):
  g = args.global_batch or SIZES[size]["global_batch"]
  bert_throughput.print_timing(size, g, sequential)
  header = ("run", "repl x stg x mb", "bubble bound", "fwd GFLOPs/stage",
            "max/min", "step ms", "examples/s", "auto/hand")
  print(" | ".join(["%-7s" % header[0], "%15s" % header[1], "%12s" %
                    header[2], "%-27s" % header[3]] +
                   ["%10s" % h for h in header[4:]]))
  rates = {run.name: g / float(np.median(run.times)) for run in runs}
  for run in runs:
    rate = rates[run.name]
    hand = rates["hand %d" % run.stages]
    print(" | ".join([
        "%-7s" % run.name, "%15s" % run.layout, "%12.3f" % run.bubble,
        "%-27s" % " ".join("%.3f" % (f / 1e9) for f in run.stage_flops),
        "%10.2f" % run.flops_ratio, "%10.1f" % (1e3 * g / rate),
        "%10.1f" % rate, "%10.2f" % (rate / hand)]), flush=True)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  bert_throughput.add_arguments(parser)
  parser.add_argument("--stage_counts", default=",".join(
      str(k) for k in STAGE_COUNTS), help="comma-separated K values")
  args = smoke.parse_args(parser, argv, bert_throughput.SMOKE + [
      "--stage_counts", "2"])
  sizes = bert_throughput.configured_sizes(args)
  print("Auto parallel vs hand-annotated BERT pipelines on %d logical CPU "
        "devices; %d CPU cores; TensorFlow %s; %d timed steps (median) after "
        "%d warm-up steps; schedule %s" % (
            DEVICES, os.cpu_count(), tf.__version__, args.steps, args.warmup,
            args.schedule))
  print("bubble bound = (K-1)/(M+K-1); fwd GFLOPs/stage = static forward "
        "FLOPs of each stage per micro-batch; auto/hand = examples/s over "
        "the hand-annotated run with as many stages")
  for size in sizes:
    print("\n%s BERT: %d layers, sequence %d, global batch %d, micro-batch "
          "%d" % (size, args.tiny_layers if size == "tiny" else
                  train.bert_config_from_flags(train.resolve_flags(
                      train.make_flags(config=size))).num_hidden_layers,
                  args.seq_length or SIZES[size]["seq_length"],
                  args.global_batch or SIZES[size]["global_batch"],
                  args.micro_batch or SIZES[size]["micro_batch"]),
          flush=True)
    begin = time.perf_counter()
    runs, sequential = measure(args, size)
    report(args, size, runs, sequential)
    print("(%s took %.0fs)" % (size, time.perf_counter() - begin), flush=True)
  epl.shutdown()
  return 0


if __name__ == "__main__":
  sys.exit(main())
