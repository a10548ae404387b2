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
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from epl.ir import names as epl_names
from epl.communicators.base import Communicator
from epl.tf_compat import graph_edit
from epl.tf_compat.horovod import horovod_api


def _kept(tensor):
  """`tensor`, whose op Grappler must keep even when only waited for."""
  graph_edit.set_attr(tensor.op, "_grappler_do_not_remove",
                      attr_value_pb2.AttrValue(b=True))
  return tensor


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
    return epl_names.horovod_op(kind, self._keys.instance_key())

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
