"""What one run of a graph moves between devices, read from its structure.

TensorFlow partitions a graph by device before it runs it: for each tensor
that ops on one device read from an op on another, it adds one
`_Send`/`_Recv` pair per receiving device (however many ops there read
it). So the tensors a run moves between devices are the graph's
cross-device edges, one per (tensor, receiving device), among the ops the
run executes: the ancestors of what it fetches.

TensorFlow's placer puts an op that takes a resource handle or a
reference (a variable's read, its update) on the device of the op that
made the handle, whatever device the op asks for: the handle never
crosses devices, the values read from it do (checked with the partition
graphs of TF 2.15: a ReadVariableOp asked on CPU:1 of a variable on CPU:0
runs on CPU:0 and sends its value). `Placement` follows that rule.

A constant is not counted: TensorFlow 2.21 copies it into each partition
that reads it (2.15 still sends the few bytes of an optimizer's scalar
hyperparameters read on another stage).
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


def _handle(tensor):
  return tensor.dtype.base_dtype == tf.resource or graph_editor.is_ref_dtype(
      tensor.dtype)


class Placement:
  """op -> the canonical device it runs on: the device of the op that made
  its first resource or reference input (through the ops that pass one
  on), else its own (`host` when it has none). Memoised per op."""

  def __init__(self, host=""):
    self.host = host
    self._devices = {}

  def __call__(self, op):
    chain = []
    while op.name not in self._devices:
      handles = [t.op for t in op.inputs if _handle(t)]
      if not handles:
        self._devices[op.name] = canonical_device(op.device, self.host)
        break
      chain.append(op)
      op = handles[0]
    for passed in chain:
      self._devices[passed.name] = self._devices[op.name]
    return self._devices[op.name]


def step_ops(roots):
  """The ops a run that fetches `roots` (ops) executes: `roots` and their
  ancestors through data and control edges."""
  return graph_editor.ancestors(roots)


def cross_device_transfers(ops, placement):
  """[Transfer] of a run of `ops` (what `step_ops` gives), one per tensor
  and receiving device, in the order of `ops`, with devices from
  `placement` (a Placement)."""
  readers = collections.OrderedDict()
  for op in ops:
    destination = placement(op)
    for tensor in op.inputs:
      if _handle(tensor) or tensor.op.type == "Const":
        continue
      source = placement(tensor.op)
      if source != destination:
        readers.setdefault((tensor.name, destination),
                           (tensor, source, []))[2].append(op)
  return [Transfer(tensor, source, destination, tuple(ops_there))
          for (_, destination), (tensor, source, ops_there)
          in readers.items()]
