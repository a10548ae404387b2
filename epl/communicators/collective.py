"""Communicator built on TensorFlow's collective ops (CollectiveReduceV2).

Ring all-reduce on CPU, NCCL on GPU. Group and instance keys are derived
deterministically from the order in which the rewrite asks for collectives,
so every worker building the same graph computes the same keys.
"""
import tensorflow as tf

from epl.communicators.base import Communicator
from epl.tf_compat.ops import collective_ops


# Instance keys that change every step live above the static ones.
_PER_STEP_KEY_BASE = 2 ** 30
_PER_STEP_KEY_RANGE = 2 ** 30 - 1
_SLOTS_PER_STEP = 4096


class CollectiveKeys:
  """Allocates group keys (per device group) and instance keys (per op)."""

  def __init__(self):
    self._group_keys = {}
    self._next_instance = 1
    self._next_slot = 0

  def group_key(self, devices, group=0):
    """The key of collective group `group` over `devices`: groups over the
    same devices are independent of each other."""
    key = (tuple(devices), group)
    if key not in self._group_keys:
      self._group_keys[key] = len(self._group_keys) + 1
    return self._group_keys[key]

  def instance_key(self):
    key = self._next_instance
    self._next_instance += 1
    return key

  def per_step_instance_key(self, step):
    """An instance key (int32 tensor) of its own in every step `step`.

    TensorFlow keeps the shape of each collective instance from the first
    step that ran it, so a collective whose shapes change from step to
    step (the rows of a sparse gradient) needs a fresh key every step, as
    TensorFlow's own cross-device code uses. Keys come from a range of
    their own, a slot per such collective; every worker derives the same
    keys from the same step.
    """
    slot = self._next_slot
    self._next_slot += 1
    if slot >= _SLOTS_PER_STEP:
      raise ValueError("EPL supports at most %d collectives with changing "
                       "shapes per step" % _SLOTS_PER_STEP)
    key = (step * _SLOTS_PER_STEP + slot) % _PER_STEP_KEY_RANGE
    return tf.cast(key + _PER_STEP_KEY_BASE, tf.int32)


class CollectiveCommunicator(Communicator):
  """Collectives over `devices` with tf collective ops."""

  def __init__(self, devices, local_members, keys, timeout_seconds,
               device_type, group=0):
    super().__init__(devices, local_members)
    self._keys = keys
    self._group_key = keys.group_key(self.devices, group)
    self._timeout = float(timeout_seconds)
    self._hint = "nccl" if device_type == "GPU" else "ring"
    # The last collective op of each local member: collectives on one device
    # run in the order they were built (NCCL deadlocks otherwise).
    self._last_op = {}

  def _collective(self, tensors, build, instance_key=None):
    assert len(tensors) == len(self.local_members), (tensors,
                                                     self.local_members)
    if instance_key is None:
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

  def all_gather(self, tensors, step=None):
    """All-gather; with `step` (an int64 tensor counting steps), under an
    instance key of its own every step, for tensors whose shapes change
    from step to step."""
    key = None if step is None else self._keys.per_step_instance_key(step)
    return self._collective(
        tensors, lambda _, t, key: collective_ops.all_gather_v2(
            t, self.group_size, self._group_key, key,
            communication_hint=self._hint, timeout=self._timeout),
        instance_key=key)

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
