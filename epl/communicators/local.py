"""All-reduce of CPU devices that live in one process: a sum on one member
that every member reads.

Logical CPU devices of one process share memory: a tensor passes from one
to another without a copy. A ring of collective ops still copies every
chunk between the members and runs its rounds one after another, which on
tiny BERT left ~35 ms of all-reduce after the last gradient (the word
embedding's, most of the model). MirroredStrategy reduces to one device
there; so does this communicator, rotating the member that sums from one
all-reduce to the next so that the adds spread over the members. Gradients
are not fused for it: concatenating them only adds copies (BERT-Base's
gradients: 155 ms unfused, 287 ms in 5 buckets; benchmarks/allreduce.py).
An all-gather is likewise a concatenation on one member that every
member reads (one copy per worker instead of one per member: ZeRO v3's
gathered weights, sparse gradients). Broadcasts (and the float16
fallback) stay collectives.
"""
import tensorflow as tf

from epl.communicators.collective import CollectiveCommunicator


class LocalCommunicator(CollectiveCommunicator):
  """CollectiveCommunicator whose all-reduce is a local sum; every member
  must be a CPU device of this process."""

  fuses = False

  def __init__(self, devices, local_members, keys, timeout_seconds,
               device_type, group=0):
    if device_type != "CPU" or len(local_members) != len(devices):
      raise ValueError(
          "LocalCommunicator needs every member on this worker's CPUs; got "
          "%s devices %s of which %d local" % (device_type, devices,
                                               len(local_members)))
    super().__init__(devices, local_members, keys, timeout_seconds,
                     device_type, group=group)

  def all_reduce(self, tensors, reduce_op):
    if reduce_op not in ("sum", "mean"):
      raise ValueError("reduce_op must be 'sum' or 'mean', got %r" % reduce_op)
    root = self._keys.instance_key() % self.group_size
    with tf.device(self.devices[root]):
      total = tf.add_n(list(tensors))
      if reduce_op == "mean":
        total = total / tf.cast(self.group_size, total.dtype)
    return [total] * len(tensors)

  def all_gather(self, tensors, step=None):
    """Concatenation in member order on one member (rotating, as
    `all_reduce`), read by every member; shapes may change between steps
    (`step` is not needed)."""
    del step
    root = self._keys.instance_key() % self.group_size
    with tf.device(self.devices[root]):
      gathered = tf.concat(list(tensors), 0)
    return [gathered] * len(tensors)
