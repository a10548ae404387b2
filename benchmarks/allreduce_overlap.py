"""Overlap of gradient all-reduce with backward in one traced step of tiny
BERT under EPL data parallelism (4 replicas on 4 logical CPU devices).

The step runs with a full trace (RunMetadata, FULL_TRACE). Each traced op is
looked up in the rewrite: forward, backward or update op of a replica
(epl.parallel.passes.schedule.blocks), or an all-reduce of gradient aggregation
(a CollectiveReduceV2 the aggregate_gradients pass built, by the graph's
provenance, with its communicator group; with --local_cpu_reduce the AddN that sums a bucket). Printed, over the union of the all-reduce ops' spans (start to end,
waits for the peers included):

  before backward ends   the fraction that lies before the last backward op
                         of the step ends (backward not finished yet)
  with backward running  the fraction during which some backward op was
                         actually executing

The picture (PNG, matplotlib from the `plot` extra) has per replica a row of
forward, backward and update ops and a row of all-reduces, coloured by
communicator; --chrome writes the same spans as Chrome trace JSON.

    python benchmarks/allreduce_overlap.py [--communicators 2]
        [--max_splits 5] [--png allreduce_overlap.png] [--chrome trace.json]
"""
import argparse
import collections
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow.compat.v1 as tf  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "benchmarks")):
  if path not in sys.path:
    sys.path.insert(0, path)

import bert_throughput  # noqa: E402
import epl  # noqa: E402
import smoke  # noqa: E402
from epl.ir.graph_state import state_of  # noqa: E402
from epl.ir.phase import Phase  # noqa: E402
from epl.parallel.passes import schedule  # noqa: E402
from epl.tools import timeline  # noqa: E402

SMOKE = ["--traces", "1", "--png", "", "--seq_length", "8", "--num_layers",
         "1"]
_PHASES = {Phase.FORWARD: "forward", Phase.BACKWARD: "backward",
           Phase.APPLY: "update"}
_COLORS = {"forward": "#4c72b0", "backward": "#dd8452", "update": "#8c8c8c"}
_GROUP_COLORS = ["#55a868", "#c44e52", "#8172b3", "#937860"]


def _union(spans):
  """Disjoint (start, end) covering `spans`."""
  merged = []
  for start, end in sorted(spans):
    if merged and start <= merged[-1][1]:
      merged[-1] = (merged[-1][0], max(merged[-1][1], end))
    else:
      merged.append((start, end))
  return merged


def _length(spans):
  return sum(end - start for start, end in spans)


def _intersection(first, second):
  """Length of the overlap of two unions of spans."""
  return sum(max(0, min(a[1], b[1]) - max(a[0], b[0]))
             for a in first for b in second)


def classify(graph):
  """{op name: (replica, kind)}: kind is a phase name or ("all-reduce",
  communicator group)."""
  state = state_of(graph)
  result = state.rewrite_result
  ctx = result.context
  kinds = {}
  for block, ops in schedule.blocks(ctx, result.subgraph,
                                    result.copies).items():
    for op in ops:
      kinds[op.name] = (block.replica, _PHASES[block.phase])
  devices = [ctx.device(local, 0) for local in range(len(ctx.replicas))]
  groups = {}
  for op in graph.get_operations():
    if (op.type in ("CollectiveReduceV2", "AddN") and
        state.provenance.pass_of(op) == "aggregate_gradients"):
      group_key = (int(tf.get_static_value(op.inputs[2]))
                   if op.type == "CollectiveReduceV2" else 0)
      group = groups.setdefault(group_key, len(groups))
      replica = next(
          ctx.replicas[local] for local, device in enumerate(devices)
          if timeline.device_key(op.device) == timeline.device_key(device))
      kinds[op.name] = (replica, ("all-reduce", group))
  return kinds


def spans_of(run_metadata, kinds):
  """[(replica, kind, start us, end us)] from the step stats, from the
  step's first op."""
  spans = []
  for device_stats in run_metadata.step_stats.dev_stats:
    for node in device_stats.node_stats:
      kind = kinds.get(node.node_name)
      if kind is not None:
        start = node.all_start_micros
        spans.append((kind[0], kind[1], start,
                      start + max(node.all_end_rel_micros, 1)))
  origin = min(s[2] for s in spans)
  return [(r, k, s - origin, e - origin) for r, k, s, e in spans]


def overlap(spans):
  """(all-reduce ms, fraction before backward ends, fraction with backward
  running, backward end ms, first all-reduce start ms)."""
  reduce_spans = _union((s, e) for _, k, s, e in spans
                        if isinstance(k, tuple))
  backward = _union((s, e) for _, k, s, e in spans if k == "backward")
  backward_end = max(e for _, e in backward)
  total = _length(reduce_spans)
  before_end = _intersection(reduce_spans, [(0, backward_end)])
  running = _intersection(reduce_spans, backward)
  return (total / 1e3, before_end / total, running / total,
          backward_end / 1e3, reduce_spans[0][0] / 1e3)


def save_png(spans, path, title):
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=import-outside-toplevel
  replicas = sorted({r for r, _, _, _ in spans})
  figure, axes = pyplot.subplots(figsize=(12, 0.9 * len(replicas) + 1.5))
  labels = []
  for index, replica in enumerate(replicas):
    compute, reduce_row = 2 * index, 2 * index + 1
    labels += ["replica %d compute" % replica, "replica %d all-reduce" %
               replica]
    for phase, color in _COLORS.items():
      merged = _union((s, e) for r, k, s, e in spans
                      if r == replica and k == phase)
      axes.broken_barh([(s / 1e3, (e - s) / 1e3) for s, e in merged],
                       (compute - 0.4, 0.8), facecolors=color)
    for r, kind, start, end in spans:
      if r == replica and isinstance(kind, tuple):
        axes.broken_barh([(start / 1e3, (end - start) / 1e3)],
                         (reduce_row - 0.35, 0.7),
                         facecolors=_GROUP_COLORS[kind[1] % 4],
                         edgecolor="white", linewidth=0.5)
  axes.set_yticks(range(len(labels)))
  axes.set_yticklabels(labels, fontsize=8)
  axes.invert_yaxis()
  axes.set_xlabel("time in the step (ms)")
  groups = sorted({k[1] for _, k, _, _ in spans if isinstance(k, tuple)})
  handles = [matplotlib.patches.Patch(color=c, label=l)
             for l, c in _COLORS.items()] + [
                 matplotlib.patches.Patch(color=_GROUP_COLORS[g % 4],
                                          label="all-reduce, comm %d" % g)
                 for g in groups]
  axes.legend(handles=handles, loc="upper center", ncol=len(handles),
              bbox_to_anchor=(0.5, -0.25), fontsize=8, frameon=False)
  axes.set_title(title, fontsize=9)
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  pyplot.close(figure)


def save_chrome(spans, path):
  events = []
  for replica, kind, start, end in spans:
    name = "all-reduce comm %d" % kind[1] if isinstance(kind, tuple) else kind
    events.append({"name": name, "ph": "X", "pid": replica,
                   "tid": 1 if isinstance(kind, tuple) else 0, "ts": start,
                   "dur": end - start})
  with open(path, "w") as out:
    json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, out)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--communicators", type=int, default=2)
  parser.add_argument("--max_splits", type=int, default=5)
  parser.add_argument("--local_cpu_reduce", action="store_true",
                      help="EPL's default on one host's CPUs: each bucket "
                      "summed on one device (the picture then shows those "
                      "sums); without it, collective ring all-reduce as "
                      "across workers and on GPUs")
  parser.add_argument("--traces", type=int, default=3,
                      help="traced steps; the one of median step time is "
                      "kept")
  parser.add_argument("--png", default="allreduce_overlap.png",
                      help="the picture's path; empty: none")
  parser.add_argument("--seq_length", type=int, default=0,
                      help="0: tiny BERT's 64")
  parser.add_argument("--num_layers", type=int, default=4,
                      help="encoder layers of tiny BERT")
  parser.add_argument("--chrome", default="")
  args = smoke.parse_args(parser, argv, SMOKE)
  tf.disable_eager_execution()
  tf.logging.set_verbosity(tf.logging.ERROR)
  os.environ["EPL_COMMUNICATION_NUM_COMMUNICATORS"] = str(args.communicators)
  os.environ["EPL_COMMUNICATION_MAX_SPLITS"] = str(args.max_splits)
  os.environ["EPL_COMMUNICATION_LOCAL_CPU_REDUCE"] = str(
      args.local_cpu_reduce)
  run = bert_throughput.Run("EPL data", "data", bert_throughput.DEVICES, 1,
                            1)
  settings = argparse.Namespace(
      seq_length=args.seq_length, tiny_layers=args.num_layers, vocab_size=0,
      schedule="PreferBackward",
      intra_op_threads=0, inter_op_threads=0, warmup=3)
  bert_throughput.build_train(
      settings, "tiny", run, bert_throughput.SIZES["tiny"]["micro_batch"])
  kinds = classify(run.session.graph)
  for _ in range(settings.warmup):
    run.session.run([run.train_op, run.loss])
  traced = []
  for _ in range(args.traces):
    metadata = tf.RunMetadata()
    run.session.run([run.train_op, run.loss], options=tf.RunOptions(
        trace_level=tf.RunOptions.FULL_TRACE), run_metadata=metadata)
    traced.append(metadata)
  results = sorted(
      ((overlap(spans_of(m, kinds)), spans_of(m, kinds)) for m in traced),
      key=lambda r: max(e for _, _, _, e in r[1]))
  (total, before_end, running, backward_end, first), spans = results[
      len(results) // 2]
  step = max(e for _, _, _, e in spans) / 1e3
  counts = collections.Counter(k for _, k, _, _ in spans
                               if isinstance(k, tuple))
  print("tiny BERT, EPL data parallel, %d replicas on %d logical CPU "
        "devices (%d cores), communication.num_communicators=%d, "
        "max_splits=%d: %d all-reduces per replica" % (
            bert_throughput.DEVICES, bert_throughput.DEVICES, os.cpu_count(),
            args.communicators, args.max_splits,
            sum(counts.values()) // bert_throughput.DEVICES))
  print("traced step %.1f ms; backward ends at %.1f ms; first all-reduce "
        "starts at %.1f ms; all-reduce busy %.1f ms" % (
            step, backward_end, first, total))
  print("overlap: %.0f%% of all-reduce time before backward ends, %.0f%% "
        "with a backward op running" % (100 * before_end, 100 * running))
  title = ("tiny BERT data parallel, one step: %d communicators; %.0f%% of "
           "all-reduce time before backward ends" % (args.communicators,
                                                     100 * before_end))
  if args.png:
    save_png(spans, args.png, title)
    print("picture: %s" % args.png)
  if args.chrome:
    save_chrome(spans, args.chrome)
    print("chrome trace: %s" % args.chrome)
  run.session.close()
  epl.shutdown()
  return 0


if __name__ == "__main__":
  sys.exit(main())
