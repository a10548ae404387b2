"""The devices an eager TF2 script gets: logical CPU devices are made
before TensorFlow's eager runtime starts.

A `Session` gets EPL's CPU devices through its `ConfigProto`
(`epl.runtime.session`); eager execution has one runtime per process,
whose devices are fixed when it starts, so `epl.init()` sets them then.
"""
import logging

import tensorflow as tf

from epl.runtime import cpu_threads
from epl.tf_compat import thread_pools

logger = logging.getLogger("epl")


def ensure_logical_cpus(cluster, threads):
  """Gives this process `cluster.devices_per_worker` logical CPU devices,
  each with the threads of the ThreadPlan `threads`, when the cluster is
  made of CPU devices and execution is eager."""
  if not tf.executing_eagerly() or cluster.device_type != "CPU":
    return
  if not thread_pools.eager_runtime_started():
    cpu_threads.set_eager_threads(threads)
  wanted = cluster.devices_per_worker
  cpu = tf.config.list_physical_devices("CPU")[0]
  configured = tf.config.get_logical_device_configuration(cpu)
  if configured is not None and len(configured) >= wanted:
    return
  try:
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * wanted)
  except RuntimeError as error:
    have = len(tf.config.list_logical_devices("CPU"))
    if have >= wanted:
      return
    raise RuntimeError(
        "epl.init() needs %d CPU devices, but TensorFlow's eager runtime "
        "already started with %d (an op or a tf.data pipeline ran before "
        "epl.init()). Call epl.init() at the top of the script, before "
        "anything runs." % (wanted, have)) from error
  logger.info("epl.init: %d logical CPU devices for eager execution.",
              wanted)
