"""Internals of the TF1 training API (`tf.compat.v1.train`)."""
# pylint: disable=protected-access
# First: checks the TensorFlow version before its internals are imported.
from epl.tf_compat import version_check  # noqa: F401  pylint: disable=unused-import
from tensorflow.python.training import optimizer as optimizer_lib


def base_finish(optimizer):
  """The base class's `Optimizer._finish` bound to `optimizer`: it only
  groups the update ops (subclasses such as Adam also advance their own
  state in theirs)."""
  return optimizer_lib.Optimizer._finish.__get__(optimizer)
