"""The interface every communication backend implements.

A communicator connects the members of one replica group (one device per
member). The rewrite calls it with one tensor per *local* member (the
members on this worker) and gets one result per local member, each placed
on that member's device. Backends: TensorFlow collectives
(`collective.CollectiveCommunicator`) and Horovod
(`horovod.HorovodCommunicator`); `backend.new_communicator` picks one.
"""


class Communicator:
  """Collectives over a fixed group of devices."""

  # Whether gradients are worth concatenating into one all-reduce: a
  # collective has a fixed cost per call, a local sum (LocalCommunicator)
  # only gains copies from it.
  fuses = True

  def __init__(self, devices, local_members):
    """`devices`: every member's device, in member order (all workers).

    `local_members`: indices into `devices` of the members this worker
    builds ops for.
    """
    self.devices = list(devices)
    self.local_members = list(local_members)

  @property
  def group_size(self):
    return len(self.devices)

  def all_reduce(self, tensors, reduce_op):
    """Element-wise reduction; `reduce_op` is "sum" or "mean"."""
    raise NotImplementedError

  def all_gather(self, tensors, step=None):
    """Concatenation of every member's tensor along the first dimension;
    `step` (a tensor counting steps) when the shapes change between
    steps."""
    raise NotImplementedError

  def broadcast(self, tensors, root_member):
    """Every member gets the tensor of `root_member`."""
    raise NotImplementedError
