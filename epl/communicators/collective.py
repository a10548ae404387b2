"""Communicator built on TensorFlow's collective ops (CollectiveReduceV2).

Ring all-reduce on CPU, NCCL on GPU. Group and instance keys are derived
deterministically from the order in which the rewrite asks for collectives,
so every worker building the same graph computes the same keys.
"""
import tensorflow as tf
from tensorflow.python.ops import collective_ops

from epl.communicators.base import Communicator


class CollectiveKeys:
  """Allocates group keys (per device group) and instance keys (per op)."""

  def __init__(self):
    self._group_keys = {}
    self._next_instance = 1

  def group_key(self, devices):
    key = tuple(devices)
    if key not in self._group_keys:
      self._group_keys[key] = len(self._group_keys) + 1
    return self._group_keys[key]

  def instance_key(self):
    key = self._next_instance
    self._next_instance += 1
    return key


class CollectiveCommunicator(Communicator):
  """Collectives over `devices` with tf collective ops."""

  def __init__(self, devices, local_members, keys, timeout_seconds,
               device_type):
    super().__init__(devices, local_members)
    self._keys = keys
    self._group_key = keys.group_key(self.devices)
    self._timeout = float(timeout_seconds)
    self._hint = "nccl" if device_type == "GPU" else "ring"
    # The last collective op of each local member: collectives on one device
    # run in the order they were built (NCCL deadlocks otherwise).
    self._last_op = {}

  def _collective(self, tensors, build):
    assert len(tensors) == len(self.local_members), (tensors,
                                                     self.local_members)
    instance_key = self._keys.instance_key()
    results = []
    for member, tensor in zip(self.local_members, tensors):
      previous = self._last_op.get(member)
      with tf.device(self.devices[member]), tf.control_dependencies(
          [previous] if previous is not None else None):
        result = build(member, tensor, instance_key)
      self._last_op[member] = result.op
      results.append(result)
    return results

  def all_reduce(self, tensors, reduce_op):
    if reduce_op not in ("sum", "mean"):
      raise ValueError("reduce_op must be 'sum' or 'mean', got %r" % reduce_op)
    final_op = "Div" if reduce_op == "mean" else "Id"
    return self._collective(
        tensors, lambda _, t, key: collective_ops.all_reduce_v2(
            t, self.group_size, self._group_key, key, merge_op="Add",
            final_op=final_op, communication_hint=self._hint,
            timeout=self._timeout))

  def all_reduce_where(self, tensors, conditions, reduce_op):
    """`all_reduce`, run by each member only where its condition holds
    (zeros elsewhere). Every member must decide the same way."""
    if reduce_op not in ("sum", "mean"):
      raise ValueError("reduce_op must be 'sum' or 'mean', got %r" % reduce_op)
    final_op = "Div" if reduce_op == "mean" else "Id"
    conditions = dict(zip(self.local_members, conditions))

    def build(member, tensor, key):
      return tf.cond(
          conditions[member],
          lambda: collective_ops.all_reduce_v2(
              tensor, self.group_size, self._group_key, key, merge_op="Add",
              final_op=final_op, communication_hint=self._hint,
              timeout=self._timeout),
          lambda: tf.zeros_like(tensor))
    return self._collective(tensors, build)

  def all_gather(self, tensors):
    return self._collective(
        tensors, lambda _, t, key: collective_ops.all_gather_v2(
            t, self.group_size, self._group_key, key,
            communication_hint=self._hint, timeout=self._timeout))

  def broadcast(self, tensors, root_member):
    def build(member, tensor, key):
      if member == root_member:
        return collective_ops.broadcast_send_v2(
            tensor, self.group_size, self._group_key, key,
            communication_hint=self._hint, timeout=self._timeout)
      return collective_ops.broadcast_recv_v2(
          tf.shape(tensor), tensor.dtype, self.group_size, self._group_key,
          key, communication_hint=self._hint, timeout=self._timeout)
    return self._collective(tensors, build)
