"""The intra-op thread pools of TensorFlow's CPU devices.

An op that cuts its work over cores (a matrix product, an elementwise op
on a large tensor) runs the pieces on its device's intra-op pool. By
default a process has one such pool, made with the first device of the
process and sized by that session's `intra_op_parallelism_threads` (0: the
cores), and every CPU device of every later session shares it. When the
environment variable TF_OVERRIDE_GLOBAL_THREADPOOL is true as the first
device of the process is made, each device is made with a pool of its own
instead, sized by the `intra_op_parallelism_threads` of the session (or of
the eager context) that makes it. TensorFlow reads the variable once, at
that first device, and keeps its answer for the life of the process
(`local_device.cc`).
"""
import os

from epl.tf_compat import eager_cluster

POOL_PER_DEVICE_VARIABLE = "TF_OVERRIDE_GLOBAL_THREADPOOL"


def pool_per_device_in_environment():
  """What the environment asks of TensorFlow: True (a pool per device),
  False, or None when the variable is unset. TensorFlow takes "1" and
  "true" (any case) for true and anything else for false."""
  value = os.environ.get(POOL_PER_DEVICE_VARIABLE)
  if value is None:
    return None
  return value.strip().lower() in ("1", "true")


def ask_pool_per_device():
  """Asks TensorFlow for a pool per CPU device; it takes effect only when
  TensorFlow has made no device in this process yet."""
  os.environ[POOL_PER_DEVICE_VARIABLE] = "1"


def eager_runtime_started():
  """True once the eager runtime has made its devices."""
  return eager_cluster.started()
