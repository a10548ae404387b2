"""The Horovod backend (communication.backend = "horovod").

A job started by `horovodrun -np P` has P processes; each is one EPL
worker (`worker_index` = Horovod rank, `worker_num` = Horovod size) with
its own devices (several GPUs, or cluster.num_cpu_devices logical CPU
devices), and its graph only names those devices: there is no
tf.distribute.Server and no remote device.

A communicator's members are the replicas of every process, the same
number in each, process by process. A collective first combines the
members of this process on its first member's device (sum, concatenation),
then runs one Horovod op across the processes, and copies the result to
the other local members.

Horovod matches the ops of the processes by name: each op gets the name
`EPL_HVD_<kind>_<n>`, where n counts the collectives the rewrite built so
far (`CollectiveKeys.instance_key`). Every process builds the same graph
in the same order, so the names agree.

Horovod's ops are not stateful, so Grappler turns one whose output nothing
reads into a no-op: the root of a broadcast whose send only a group waits
for (VariableSync on rank 0) would never send. Every Horovod op is marked
`_grappler_do_not_remove`.
"""
import logging
import os

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from epl.cluster import Cluster, _visible_gpu_count
from epl.communicators.base import Communicator

logger = logging.getLogger("epl")

_INSTALL_HINT = (
    "communication.backend is \"horovod\" but Horovod cannot be imported "
    "(%s). Install it with TensorFlow support, e.g. `make horovod` in the "
    "EPL checkout, or `HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 pip "
    "install --no-build-isolation 'epl[horovod]'`; or use the default "
    "backend \"collective\".")


def _kept(tensor):
  """`tensor`, whose op Grappler must keep even when only waited for."""
  tensor.op._set_attr("_grappler_do_not_remove",  # pylint: disable=protected-access
                      attr_value_pb2.AttrValue(b=True))
  return tensor


def horovod_api():
  """`horovod.tensorflow`, or an ImportError that says how to install it."""
  try:
    import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
  except ImportError as error:
    raise ImportError(_INSTALL_HINT % error) from error
  return hvd


def _local_gpus(config, hvd):
  """The GPUs of this process: all visible ones, or with several processes
  on one machine and no cluster.run_visible_devices, an equal share each
  by local rank (written to cluster.run_visible_devices)."""
  gpus = _visible_gpu_count(config.cluster.run_visible_devices)
  local_size = hvd.local_size()
  if not gpus or config.cluster.run_visible_devices or local_size == 1:
    return gpus
  share = gpus // local_size
  if not share:
    raise ValueError(
        "horovod: %d processes on this machine share %d GPU(s); start at "
        "most one process per GPU (horovodrun -np)." % (local_size, gpus))
  first = hvd.local_rank() * share
  config.cluster.run_visible_devices = ",".join(
      str(first + i) for i in range(share))
  logger.info("horovod: local rank %d uses GPU(s) %s of this machine",
              hvd.local_rank(), config.cluster.run_visible_devices)
  return share


class HorovodCluster(Cluster):
  """The processes of a Horovod job, one worker each, every one with the
  same number of local devices."""

  def __init__(self, rank, size, device_type, devices_per_worker):
    super().__init__([], rank, device_type, devices_per_worker)
    self.num_processes = size

  @classmethod
  def from_horovod(cls, config):
    """Initialises Horovod (hvd.init) and describes this process."""
    if os.environ.get("TF_CONFIG", "").strip():
      raise ValueError(
          "TF_CONFIG is set, but communication.backend is \"horovod\": "
          "horovodrun starts the workers of a Horovod job. Unset TF_CONFIG, "
          "or use communication.backend \"collective\" with TF_CONFIG.")
    hvd = horovod_api()
    hvd.init()
    gpus = _local_gpus(config, hvd)
    if gpus:
      return cls(hvd.rank(), hvd.size(), "GPU", gpus)
    return cls(hvd.rank(), hvd.size(), "CPU",
               config.cluster.num_cpu_devices or 1)

  @property
  def worker_num(self):
    return self.num_processes

  @property
  def is_distributed(self):
    return self.num_processes > 1

  @property
  def runs_tf_server(self):
    return False

  def check_plan(self, plan):
    """Raises for a plan whose replica spans processes (its stages on
    several processes) or that splits TaskGraphs across processes: a
    process's graph only holds its own devices."""
    for replica, workers in enumerate(plan.device_workers):
      if len(set(workers)) > 1:
        raise ValueError(
            "communication.backend \"horovod\": model replica %d puts its "
            "%d pipeline stages on processes %s, but each Horovod process "
            "builds only its own devices' ops; pipelines across processes "
            "are not built. Give every process at least %d device(s) "
            "(GPUs, or cluster.num_cpu_devices on CPU), keep "
            "cluster.device_place_prefer_intra_node on, or use the "
            "\"collective\" backend with TF_CONFIG." % (
                replica, len(workers), sorted(set(workers)), len(workers)))
    if plan.has_split and self.num_processes > 1:
      raise NotImplementedError(
          "communication.backend \"horovod\": epl.split across %d processes "
          "is not built (its shard groups exchange activations between "
          "processes). Run epl.split in one process, or use the "
          "\"collective\" backend with TF_CONFIG." % self.num_processes)
    return plan

  def __repr__(self):
    return ("HorovodCluster(processes=%d, rank=%d, %d %s device(s) per "
            "process, %d in total)" % (
                self.num_processes, self.worker_index,
                self.devices_per_worker, self.device_type,
                self.total_devices))


class HorovodCommunicator(Communicator):
  """Collectives over members spread equally over every Horovod process:
  a local step within this process, then one Horovod op across."""

  def __init__(self, devices, local_members, keys, cluster):
    super().__init__(devices, local_members)
    count = len(self.local_members)
    first = cluster.worker_index * count
    if (count * cluster.worker_num != len(self.devices) or
        self.local_members != list(range(first, first + count))):
      raise ValueError(
          "horovod: a communicator needs the same number of members in "
          "every process, process by process; process %d of %d holds "
          "members %s of %d." % (cluster.worker_index, cluster.worker_num,
                                 self.local_members, len(self.devices)))
    self._keys = keys
    self._rank = cluster.worker_index
    self._across = cluster.worker_num > 1
    self._device = self.devices[self.local_members[0]]

  def _name(self, kind):
    return "EPL_HVD_%s_%d" % (kind, self._keys.instance_key())

  def _spread(self, value):
    """`value` for every local member, copied to each one's device."""
    results = [value]
    for member in self.local_members[1:]:
      with tf.device(self.devices[member]):
        results.append(tf.identity(value))
    return results

  def _allreduce(self, tensor, op, kind="allreduce"):
    """One Horovod all-reduce across the processes, `op` a Horovod op
    (hvd.Sum, hvd.Max)."""
    return _kept(horovod_api().allreduce(
        tensor, op=op, name=self._name(kind), ignore_name_scope=True))

  def _local_sum(self, tensors):
    return tensors[0] if len(tensors) == 1 else tf.add_n(tensors)

  def _finish(self, total, reduce_op):
    if reduce_op == "mean":
      return total / tf.cast(self.group_size, total.dtype)
    return total

  def all_reduce(self, tensors, reduce_op):
    _check_reduce_op(reduce_op)
    with tf.device(self._device):
      total = self._local_sum(tensors)
      if self._across:
        total = self._allreduce(total, horovod_api().Sum)
      return self._spread(self._finish(total, reduce_op))

  def all_reduce_where(self, tensors, conditions, reduce_op):
    """`all_reduce` where the members' conditions hold, zeros elsewhere.

    The processes first agree (a max over the processes of any local
    member's condition), so that a Horovod op inside the condition runs in
    every process or in none, whatever each computed.
    """
    _check_reduce_op(reduce_op)
    with tf.device(self._device):
      total = self._local_sum(tensors)
      condition = tf.reduce_any(tf.stack(conditions))
      if not self._across:
        reduced = total
      else:
        hvd = horovod_api()
        condition = self._allreduce(tf.cast(condition, tf.int32), hvd.Max,
                                    "agree") > 0
        reduced = tf.cond(
            condition,
            lambda: self._allreduce(total, hvd.Sum, "allreduce_where"),
            lambda: tf.zeros_like(total))
      result = tf.where(condition, self._finish(reduced, reduce_op),
                        tf.zeros_like(total))
      return self._spread(result)

  def all_gather(self, tensors, step=None):
    """Concatenation in member order. Horovod gathers tensors whose first
    dimension differs between processes and steps as they are, so `step`
    is not needed."""
    del step
    with tf.device(self._device):
      gathered = tensors[0] if len(tensors) == 1 else tf.concat(tensors, 0)
      if self._across:
        gathered = _kept(horovod_api().allgather(
            gathered, name=self._name("allgather"), ignore_name_scope=True))
      return self._spread(gathered)

  def broadcast(self, tensors, root_member):
    root_rank, root_local = divmod(root_member, len(self.local_members))
    value = tensors[root_local if root_rank == self._rank else 0]
    with tf.device(self._device):
      if self._across:
        value = _kept(horovod_api().broadcast(
            value, root_rank, name=self._name("broadcast"),
            ignore_name_scope=True))
      return self._spread(value)


def _check_reduce_op(reduce_op):
  if reduce_op not in ("sum", "mean"):
    raise ValueError("reduce_op must be 'sum' or 'mean', got %r" % reduce_op)
