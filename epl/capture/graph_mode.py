"""EPL rewrites graphs: TensorFlow must build in graph mode.

`epl.init` switches an eager TF2 process to graph mode; objects built
eagerly before it (a `tf.data.Dataset`) cannot enter a graph, and using
one says so, naming the fix, instead of failing deep inside TensorFlow.
"""
import logging

import tensorflow as tf

from epl.tf_compat.ops import EagerTensor

logger = logging.getLogger("epl")


def ensure_graph_mode():
  """Switches eager TF2 to graph mode before any build."""
  if tf.executing_eagerly():
    tf.compat.v1.disable_eager_execution()
    logger.info("epl.init: eager execution was on; switched to graph mode "
                "(tf.compat.v1.disable_eager_execution).")


def check_dataset_in_graph(dataset):
  """Raises for a dataset built eagerly, before `epl.init()`, used in a
  graph."""
  if tf.executing_eagerly():
    return
  variant = getattr(dataset, "_variant_tensor_attr", None)
  if isinstance(variant, EagerTensor):
    raise ValueError(
        "This tf.data.Dataset was built before epl.init(), while TensorFlow "
        "was still executing eagerly; epl.init() switched to graph mode, "
        "where the dataset cannot be used. Call epl.init() before building "
        "the input pipeline (or call "
        "tf.compat.v1.disable_eager_execution() at the top of the script).")
