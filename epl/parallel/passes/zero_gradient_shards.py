"""ZeRO v3's gradient shards: shard s's rows of the gradient of a
partitioned weight, summed over replicas (and micro-batches), made without
a full-size gradient on any replica where the op that makes it allows.

The gradient of a dense layer's kernel is `MatMul(x, dy, transpose_a)`,
and its sum over replicas is one MatMul over their concatenated batches.
Where nothing but the update reads the gradient (and the micro-batch sum
the shards now build), shard s's summed rows are one MatMul, on shard s's
device, of the same columns of every replica's `x` with every `dy`
(`summed_shards`): only those slices and the activations' gradients
travel, far less than the gradient's rows at the usual batch sizes, and
no replica makes the full gradient nor its N slices. For a MatMul laid
out otherwise, each replica makes each shard's rows as its own MatMul of
1/N the size (`shards_of`). The gate `minimize` puts on the gradients of
one op (tf.tuple: every gradient of the MatMul waits for all of them)
then waits for the input gradient only; the shard products wait for the
gates, so each shard's update still runs after the backward pass read
the weight. Any other gradient (one made by another op, or read by more
than its update: clipping, summaries) is sliced after it is made.
"""
import dataclasses

import tensorflow as tf

from epl.ir import graph_editor
from epl.parallel.passes.split_checkpoint import shard_slice


def _product_behind(tensor, leaving):
  """(MatMul, its gates) that make gradient `tensor`, when every reader of
  `tensor` is in `leaving` (names of the ops that will not read it) and
  the MatMul's output is read by nothing else; else None."""
  if any(c.name not in leaving for c in tensor.consumers()):
    return None
  op, gates = tensor.op, []
  if op.type == "Identity" and op.inputs[0].op.type == "MatMul":
    if [c for c in op.inputs[0].consumers() if c is not op]:
      return None
    gates, op = list(op.control_inputs), op.inputs[0].op
  return (op, gates) if op.type == "MatMul" else None


def shards_of(tensor, info, rank, leaving):
  """[shard s's rows of gradient `tensor` for s in range(N)] (the
  unsharded shape's tensor `tensor`, ShardedVariable `info`, rank
  `rank`), built on its device: MatMuls of slices of the inputs of the
  MatMul that makes it, where only the ops named in `leaving` read it
  (see the module's note), else slices of `tensor`."""
  product = _product_behind(tensor, leaving) if info.axis == 0 else None
  with tf.device(tensor.device):
    if product is None:
      return [shard_slice(tensor, info, shard, rank)
              for shard in range(info.group_size)]
    matmul, gates = product
    for gate in gates:
      graph_editor.remove_control_input(gate, matmul)
    transpose_a = matmul.get_attr("transpose_a")
    # The rows of the product are the columns of a transposed `a`.
    rows_of_a = dataclasses.replace(info, axis=1 if transpose_a else 0)
    with tf.control_dependencies([g for g in gates if g is not matmul]):
      return [tf.linalg.matmul(
          shard_slice(matmul.inputs[0], rows_of_a, shard, 2),
          matmul.inputs[1], transpose_a=transpose_a,
          transpose_b=matmul.get_attr("transpose_b"))
              for shard in range(info.group_size)]


def summed_shards(tensors, info, leaving, devices):
  """[shard s's rows of the sum of `tensors` (every replica's gradient of
  one kernel, of every micro-batch), built on `devices[s]`] as one MatMul
  per shard of the columns of every `x` it needs, concatenated along the
  batch, with every `dy`: the sum over replicas and micro-batches is the
  product over their concatenated batches. Only the slices of `x` travel,
  and the activations' gradients. None unless each tensor is made by a
  kernel gradient `MatMul(x, dy, transpose_a=True)` that only the ops
  named in `leaving` read."""
  products = [_product_behind(t, leaving) for t in tensors]
  if info.axis != 0 or any(
      p is None or not p[0].get_attr("transpose_a") or
      p[0].get_attr("transpose_b") for p in products):
    return None
  gates = []
  for matmul, own_gates in products:
    for gate in own_gates:
      graph_editor.remove_control_input(gate, matmul)
    gates.extend(g for g in own_gates if g is not matmul)
  columns = dataclasses.replace(info, axis=1)
  summed = []
  for shard, device in enumerate(devices):
    slices = []
    for matmul, _ in products:
      with tf.device(matmul.device):
        slices.append(shard_slice(matmul.inputs[0], columns, shard, 2))
    with tf.device(device), tf.control_dependencies(gates):
      summed.append(tf.linalg.matmul(
          tf.concat(slices, 0),
          tf.concat([m.inputs[1] for m, _ in products], 0),
          transpose_a=True))
  return summed
