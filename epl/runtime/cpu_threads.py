"""How the logical CPU devices of one process share its cores.

On a machine without GPUs, EPL's replicas are logical CPU devices of one
process (`cluster.num_cpu_devices`) that run side by side on the same
cores. TensorFlow gives every CPU device of a process one intra-op pool
as wide as the cores, so each replica's matrix products are cut again
over every core, and the cuts and their joins are work plain TensorFlow on
one device does not do: with 4 replicas on 2 cores, EPL's data-parallel
BERT step cost 1.07-1.09x plain TensorFlow's CPU time on the same global
batch. The replicas already keep the cores busy, so EPL gives each device
a pool of its own of cores / devices threads (at least 1, rounded up): the
same step then costs 0.96-1.0x plain TensorFlow's CPU
(docs/data_parallel.md has the figures).

TensorFlow decides between one pool and a pool per device once per
process, when it makes its first device (`epl.tf_compat.thread_pools`),
so `epl.init` decides before anything runs (`plan_at_init`), and every
session, server and the eager runtime are then made with the plan's
threads. A session whose devices still share one pool (TensorFlow made a
device before `epl.init` asked) is said once (`check_session`): it trains
the same, more slowly.
"""
import dataclasses
import logging
import math
import os
from typing import Optional

import tensorflow as tf

from epl.tf_compat import thread_pools

logger = logging.getLogger("epl")


@dataclasses.dataclass(frozen=True)
class ThreadPlan:
  """Each of a worker's `devices` CPU devices runs its ops on a pool of its
  own of `threads_per_device` threads, or, when that is None, on
  TensorFlow's one pool shared by the process's CPU devices; because
  `reason`. `configured`: the threads are the configuration's
  (cluster.cpu_device_threads), not EPL's default."""
  threads_per_device: Optional[int]
  devices: int
  reason: str
  configured: bool = False

  def describe(self):
    if self.threads_per_device is None:
      return "one pool shared by the CPU devices, because %s" % self.reason
    return ("a pool of %d thread(s) for each of the %d CPU devices, "
            "because %s" % (self.threads_per_device, self.devices,
                            self.reason))


def _cores():
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # Not Linux.
    return os.cpu_count() or 1


def decide(config, cluster, cores, asked_in_environment, eager_started):
  """The ThreadPlan of `cluster` under `config` on `cores` cores;
  `asked_in_environment`: thread_pools.pool_per_device_in_environment();
  `eager_started`: whether the eager runtime has made its devices."""
  devices = cluster.devices_per_worker
  if cluster.device_type != "CPU" or devices == 1:
    return ThreadPlan(None, devices, "a worker has one CPU device")
  wanted = config.cluster.cpu_device_threads
  if wanted == 0:
    return ThreadPlan(None, devices, "cluster.cpu_device_threads is 0")
  if asked_in_environment is False:
    return ThreadPlan(None, devices, "%s is false in the environment" %
                      thread_pools.POOL_PER_DEVICE_VARIABLE)
  if eager_started and not asked_in_environment:
    return ThreadPlan(None, devices, "TensorFlow's eager runtime started "
                      "before epl.init, with its devices sharing one pool "
                      "(call epl.init before anything runs)")
  if wanted is not None:
    return ThreadPlan(wanted, devices, "cluster.cpu_device_threads is %d" %
                      wanted, configured=True)
  return ThreadPlan(
      max(1, math.ceil(cores / devices)), devices,
      "the %d replicas' devices already run side by side on this "
      "machine's %d core(s): one pool would cut each op again over every "
      "core" % (devices, cores))


def plan_at_init(config, cluster):
  """Decides the ThreadPlan of `cluster` at `epl.init`, asks TensorFlow for
  a pool per device if it says so, and logs it when a worker has several
  CPU devices."""
  plan = decide(config, cluster, _cores(),
                thread_pools.pool_per_device_in_environment(),
                thread_pools.eager_runtime_started())
  if plan.threads_per_device is not None:
    thread_pools.ask_pool_per_device()
  if cluster.device_type == "CPU" and plan.devices > 1:
    logger.info("epl.init: CPU threads: %s.", plan.describe())
  return plan


def set_threads(plan, proto):
  """Gives a session's or server's ConfigProto `proto` the plan's threads
  per device, unless the user's config sets its own."""
  if (plan is not None and plan.threads_per_device is not None and
      not proto.intra_op_parallelism_threads):
    proto.intra_op_parallelism_threads = plan.threads_per_device


def set_eager_threads(plan):
  """Gives the eager runtime, before it starts, the plan's threads per
  device, unless the script set its own."""
  if (plan.threads_per_device is not None and
      not tf.config.threading.get_intra_op_parallelism_threads()):
    tf.config.threading.set_intra_op_parallelism_threads(
        plan.threads_per_device)


def thread_count():
  """The threads of this process (Linux), or None."""
  try:
    return len(os.listdir("/proc/self/task"))
  except OSError:
    return None


_warned = {"shared": False}


def check_session(plan, threads_before):
  """Says once when a local session just made under a plan of pools per
  device started fewer threads than it has devices (`threads_before`:
  thread_count() before the session): its devices joined the one pool
  TensorFlow had made with a device before epl.init asked. A warning when
  the configuration asked for the threads; at INFO when they were EPL's
  default (a script that runs plain TensorFlow before EPL to compare)."""
  after = thread_count()
  if (plan is None or plan.threads_per_device is None or
      threads_before is None or after is None or _warned["shared"]):
    return
  if after - threads_before >= plan.devices:
    return
  _warned["shared"] = True
  logger.log(
      logging.WARNING if plan.configured else logging.INFO,
      "EPL asked TensorFlow for a pool of %d thread(s) for each of the %d "
      "CPU devices, but this session's devices share one pool: "
      "TensorFlow made a device in this process before epl.init (a Session "
      "opened or an op ran first). Training is the same, but each "
      "replica's ops are cut over every core, which costs CPU time. Call "
      "epl.init() before anything runs, or set cluster.cpu_device_threads "
      "to 0 to keep one pool without this message.",
      plan.threads_per_device, plan.devices)
