"""Draws docs/pipeline_gpipe.png, docs/pipeline_1f1b.png,
docs/pipeline_interleaved.png, docs/pipeline_zb_h1.png and
docs/pipeline_zb_v.png for docs/pipeline.md: one traced training step of
the BERT example (examples/bert_large, tiny, 8 encoder layers) as a
pipeline on 4 logical CPU devices with 4 micro-batches under each schedule
(GPipe, 1F1B and ZB-H1: 4 stages; interleaved 1F1B and ZB-V: 8 stages, two
per device, drawn one row per device; ZB-V with 2p - 1 = 7 micro-batches,
the fewest its order takes), with epl.timeline's Gantt helper (needs
matplotlib).

    python benchmarks/pipeline_pictures.py [--out_dir docs] [--smoke]
"""
import argparse
import logging
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import epl  # noqa: E402
from epl.parallel.plan.pipeline_order import Schedule  # noqa: E402
from epl.tools import timeline  # noqa: E402

import bert_schedules  # noqa: E402  (benchmarks/, next to this script)
import smoke  # noqa: E402

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), "docs")
# The smoke size draws the same pictures, of a smaller BERT on 2 devices,
# into a temporary folder.
SMOKE = ["--out_dir", os.path.join(tempfile.gettempdir(),
                                   "epl_pipeline_pictures"),
         "--devices", "2", "--micro_batch", "1", "--seq_length", "8",
         "--vocab_size", "100"]


def trace(args, schedule, micro_batches):
  """The PipelineTrace of the 3rd step of `schedule` (after 2 untraced
  ones: the first also rewrites the graph)."""
  pipeline = bert_schedules.Pipeline(
      schedule, args.devices, args.devices,
      bert_schedules.layers_needed(args.devices), micro_batches,
      args.micro_batch, args.seq_length, args.vocab_size)
  logging.getLogger("epl").setLevel(logging.WARNING)
  try:
    pipeline.step()
    return timeline.trace_step(pipeline.session, pipeline.train_op)[1]
  finally:
    pipeline.close()
    epl.shutdown()


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out_dir", default=DOCS)
  parser.add_argument("--devices", type=int, default=4,
                      help="logical CPU devices of the pipeline")
  parser.add_argument("--micro_batches", type=int, default=4)
  parser.add_argument("--micro_batch", type=int, default=4,
                      help="examples per micro-batch")
  parser.add_argument("--seq_length", type=int, default=32)
  parser.add_argument("--vocab_size", type=int, default=1000)
  args = smoke.parse_args(parser, argv, SMOKE)
  tf.compat.v1.disable_eager_execution()
  os.makedirs(args.out_dir, exist_ok=True)
  for schedule in bert_schedules.SCHEDULES:
    if schedule.picture is None:
      continue
    stages = args.devices * schedule.virtual_stages
    micro_batches = args.micro_batches
    if Schedule.of(schedule.strategy).v_shaped:
      micro_batches = max(micro_batches, 2 * args.devices - 1)
    path = trace(args, schedule, micro_batches).save_gantt(
        os.path.join(args.out_dir, schedule.picture),
        title="%s: BERT, %d stages on %d devices, %d micro-batches, one "
        "traced step" % (schedule.name, stages, args.devices,
                         micro_batches),
        by_device=schedule.virtual_stages > 1)
    print("wrote", os.path.relpath(path, os.getcwd()))
  return 0


if __name__ == "__main__":
  sys.exit(main())
