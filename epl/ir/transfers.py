"""What one run of a graph moves between devices, read from its structure.

TensorFlow partitions a graph by device before it runs it: for each tensor
that ops on one device read from an op on another, it adds one
`_Send`/`_Recv` pair per receiving device (however many ops there read
it). So the tensors a run moves between devices are the graph's
cross-device edges, one per (tensor, receiving device), among the ops the
run executes: the ancestors of what it fetches.

Resource handles cross devices without their data (an op that reads a
variable runs where the variable is), so they are not transfers.
"""
import collections
import dataclasses
from typing import Tuple

import tensorflow as tf

from epl.ir import graph_editor


@dataclasses.dataclass(frozen=True)
class Transfer:
  """`tensor`, made on device `source`, received on `destination` by the
  ops `readers` (one _Send/_Recv pair)."""
  tensor: tf.Tensor
  source: str
  destination: str
  readers: Tuple[tf.Operation, ...]


def canonical_device(device, default=""):
  """One spelling per device ("/job:.../device:CPU:0"); an op without a
  device is on `default` (TensorFlow puts it on the host), and a device
  without an index ("/device:CPU") is index 0, where TensorFlow puts it."""
  if not device:
    device = default
  if not device:
    return ""
  spec = tf.DeviceSpec.from_string(device)
  if spec.device_type and spec.device_index is None:
    spec = spec.replace(device_index=0)
  return spec.to_string()


def step_ops(roots):
  """The ops a run that fetches `roots` (ops) executes: `roots` and their
  ancestors through data and control edges."""
  return graph_editor.ancestors(roots)


def cross_device_transfers(ops, host=""):
  """[Transfer] of a run of `ops` (what `step_ops` gives), one per tensor
  and receiving device, in the order of `ops`; ops without a device count
  on `host`."""
  readers = collections.OrderedDict()
  for op in ops:
    destination = canonical_device(op.device, host)
    for tensor in op.inputs:
      if tensor.dtype.base_dtype == tf.resource:
        continue
      source = canonical_device(tensor.op.device, host)
      if source != destination:
        readers.setdefault((tensor.name, destination),
                           (tensor, source, []))[2].append(op)
  return [Transfer(tensor, source, destination, tuple(ops_there))
          for (_, destination), (tensor, source, ops_there)
          in readers.items()]
