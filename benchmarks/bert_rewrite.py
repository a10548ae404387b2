"""EPL's graph rewrite of BERT-Large: time and op count, against building
the single-device graph.

One run, in this process:
  1. plain TensorFlow builds the single-device training graph of BERT
     (model, AdamW optimizer, synthetic input): the baseline build time;
  2. EPL builds the same graph with its annotations (8 logical CPU devices,
     data parallel, pipeline.num_micro_batch = 4 by default: 8 replicas x 4
     micro-batches), capture hooks on;
  3. `epl.parallel.engine.ensure_rewritten(graph)` runs the rewrite (what
     the first Session.run or Graph.finalize triggers), timed on its own.
Nothing is initialised or run: BERT-Large has 336M parameters.

    python benchmarks/bert_rewrite.py                    # BERT-Large, 8 x 4
    python benchmarks/bert_rewrite.py --num_layers 4     # smaller, faster
    python benchmarks/bert_rewrite.py --parallel pipeline_data --num_stages 2
"""
import argparse
import collections
import gc
import logging
import os
import resource
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow.compat.v1 as tf  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

import epl  # noqa: E402
from benchmarks import smoke  # noqa: E402
from epl.parallel import engine  # noqa: E402
from examples.bert_large import modeling  # noqa: E402
from examples.bert_large import train  # noqa: E402


SMOKE = ["--config", "tiny", "--num_cpu_devices", "2", "--num_micro_batch",
         "2", "--seq_length", "8", "--batch_size", "1"]


def _flags(args, parallel):
  return train.make_flags(
      config=args.config, num_layers=args.num_layers, parallel=parallel,
      num_cpu_devices=args.num_cpu_devices if parallel != "none" else 0,
      num_micro_batch=args.num_micro_batch if parallel != "none" else 1,
      num_stages=args.num_stages, batch_size=args.batch_size,
      seq_length=args.seq_length, steps=1000)


def _rss_gib():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def build_single(args):
  """(seconds, op count, parameters) of the plain single-device graph."""
  graph = tf.Graph()
  with graph.as_default():
    start = time.perf_counter()
    train.build_graph(_flags(args, "none"))
    seconds = time.perf_counter() - start
    return seconds, len(graph.get_operations()), modeling.count_parameters()


def build_and_rewrite(args):
  """Build seconds, op count before, rewrite seconds, op count after, the
  plan, and the op count per rewrite pass that built them (provenance)."""
  graph = tf.Graph()
  try:
    with graph.as_default():
      start = time.perf_counter()
      train.build_graph(_flags(args, args.parallel))
      build_s = time.perf_counter() - start
      before = len(graph.get_operations())
      logging.getLogger("epl").setLevel(logging.WARNING)
      start = time.perf_counter()
      result = engine.ensure_rewritten(graph)
      rewrite_s = time.perf_counter() - start
      operations = graph.get_operations()
      origins = result.context.state.provenance
      by_pass = collections.Counter(
          origins.pass_of(op) or "(user's ops: replica 0, micro-batch 0)"
          for op in operations)
      return build_s, before, rewrite_s, len(operations), result.plan, (
          by_pass)
  finally:
    epl.shutdown()


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="large",
                      choices=["tiny", "base", "large"])
  parser.add_argument("--num_layers", type=int, default=0,
                      help="encoder layers (0: the preset's, 24 for large)")
  parser.add_argument("--num_cpu_devices", type=int, default=8)
  parser.add_argument("--num_micro_batch", type=int, default=4)
  parser.add_argument("--parallel", default="data",
                      choices=["data", "pipeline", "pipeline_data"])
  parser.add_argument("--num_stages", type=int, default=2,
                      help="pipeline stages (pipeline modes)")
  parser.add_argument("--batch_size", type=int, default=8,
                      help="micro-batch (shapes only; nothing runs)")
  parser.add_argument("--seq_length", type=int, default=128)
  args = smoke.parse_args(parser, argv, SMOKE)
  tf.disable_eager_execution()
  layers = args.num_layers or modeling.BertConfig.from_name(
      args.config).num_hidden_layers
  print("BERT graph rewrite: config %s, %d encoder layers, sequence %d; EPL "
        "%s on %d logical CPU devices, pipeline.num_micro_batch %d%s; "
        "TensorFlow %s, %d CPU cores. Build only, nothing initialised." % (
            args.config, layers, args.seq_length, args.parallel,
            args.num_cpu_devices, args.num_micro_batch,
            ", %d stages" % args.num_stages
            if args.parallel != "data" else "", tf.__version__,
            os.cpu_count()), flush=True)

  single_s, single_ops, params = build_single(args)
  gc.collect()
  print("single device (plain TF): built in %.1fs, %d ops, %.1fM parameters"
        % (single_s, single_ops, params / 1e6), flush=True)
  build_s, before, rewrite_s, after, plan, by_pass = build_and_rewrite(args)
  print("EPL plan: " + plan.describe().replace("\n", "\n  "))
  print("EPL: built with annotations in %.1fs (%d ops), rewritten in %.1fs "
        "to %d ops" % (build_s, before, rewrite_s, after))
  print("ops after the rewrite by the pass that built them:")
  for name, count in sorted(by_pass.items()):
    print("  %-42s %8d" % (name, count))
  copies = plan.num_replicas * plan.num_micro_batch
  print()
  print("%-44s %10s %10s" % ("", "seconds", "ops"))
  print("%-44s %10.1f %10d" % ("single-device graph (plain TF build)",
                               single_s, single_ops))
  print("%-44s %10.1f %10d" % ("EPL build (capture on)", build_s, before))
  print("%-44s %10.1f %10d" % ("EPL rewrite (%d replicas x %d micro-batches)"
                               % (plan.num_replicas, plan.num_micro_batch),
                               rewrite_s, after))
  print("ratios: rewrite time / single-device build time = %.2f; "
        "EPL build / single-device build = %.2f; ops after / single-device "
        "ops = %.1f (%d replica x micro-batch copies of the forward and "
        "backward pass); rewrite %.0f us per op added" % (
            rewrite_s / single_s, build_s / single_s, after / single_ops,
            copies, 1e6 * rewrite_s / max(1, after - before)))
  print("peak RSS %.1f GiB" % _rss_gib())
  return 0


if __name__ == "__main__":
  sys.exit(main())
