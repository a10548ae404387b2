"""TF1 scripts build in graph mode; EPL leaves eager execution as the
script set it.

A TF1 script switches eager execution off itself
(`tf.compat.v1.disable_eager_execution()`), as it must to run on TF 2
without EPL; a TF2 script keeps it on and EPL rewrites its `tf.function`
train step (`epl.capture.traced_step`). Objects built eagerly before the
switch (a `tf.data.Dataset`) cannot enter a graph: using one says so,
naming the fix, instead of failing deep inside TensorFlow.
"""
import tensorflow as tf

from epl.tf_compat.ops import EagerTensor


def check_dataset_in_graph(dataset):
  """Raises for a dataset built eagerly used in a graph."""
  if tf.executing_eagerly():
    return
  variant = getattr(dataset, "_variant_tensor_attr", None)
  if isinstance(variant, EagerTensor):
    raise ValueError(
        "This tf.data.Dataset was built while TensorFlow was executing "
        "eagerly (before tf.compat.v1.disable_eager_execution(), or "
        "before epl.init()); it cannot be used in the graph. Call "
        "tf.compat.v1.disable_eager_execution() at the top of the script, "
        "then epl.init(), before building the input pipeline.")
