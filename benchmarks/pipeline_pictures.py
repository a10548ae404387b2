"""Draws docs/pipeline_gpipe.png, docs/pipeline_1f1b.png and
docs/pipeline_zb_h1.png for
docs/pipeline.md: one traced training step of a 4-stage pipeline with 4
micro-batches under each schedule, with epl.timeline's Gantt helper (needs
matplotlib).

    python benchmarks/pipeline_pictures.py
"""
import logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import epl  # noqa: E402
from epl.tools import timeline  # noqa: E402

import stage_model  # noqa: E402  (benchmarks/, next to this script)

STAGES, MICRO_BATCHES, LAYERS, WIDTH, BATCH = 4, 4, 2, 512, 128
PICTURES = {"PreferForward": ("pipeline_gpipe.png", "PreferForward (GPipe)"),
            "PreferBackward": ("pipeline_1f1b.png", "PreferBackward (1F1B)"),
            "ZeroBubble": ("pipeline_zb_h1.png", "ZeroBubble (ZB-H1)")}
DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), "docs")


def trace(strategy):
  """The PipelineTrace of the 4th step (after 3 untraced ones)."""
  epl.init(epl.Config({"cluster.num_cpu_devices": STAGES,
                       "pipeline.num_micro_batch": MICRO_BATCHES,
                       "pipeline.strategy": strategy}))
  logging.getLogger("epl").setLevel(logging.WARNING)
  try:
    with tf.Graph().as_default():
      train_op = stage_model.build_train_op(STAGES, LAYERS, WIDTH, BATCH)
      config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1,
                                        inter_op_parallelism_threads=STAGES)
      with tf.compat.v1.Session(config=config) as session:
        session.run(tf.compat.v1.global_variables_initializer())
        for _ in range(3):
          session.run(train_op)
        return timeline.trace_step(session, train_op)[1]
  finally:
    epl.shutdown()


def main():
  tf.compat.v1.disable_eager_execution()
  os.makedirs(DOCS, exist_ok=True)
  for strategy, (name, title) in PICTURES.items():
    path = trace(strategy).save_gantt(
        os.path.join(DOCS, name), title="%s: %d stages, %d micro-batches, "
        "one traced step" % (title, STAGES, MICRO_BATCHES))
    print("wrote", path)
  return 0


if __name__ == "__main__":
  sys.exit(main())
