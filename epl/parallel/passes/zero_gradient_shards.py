"""ZeRO v3's gradient shards: each replica's slice, for every shard, of its
gradient of a partitioned weight, made without the full-size gradient
where the op that makes it allows.

The gradient of a dense layer's kernel is `MatMul(x, dy, transpose_a)`:
rows [s·c, (s+1)·c) of it are `MatMul` of the same columns of `x` with
`dy`. Where nothing but the update reads the gradient (and the
micro-batch sum the owners now build), each shard's rows are computed so,
N MatMuls of 1/N the size: the full gradient never exists on the
replica. The gate `minimize` puts on the gradients of one op (tf.tuple:
every gradient of the MatMul waits for all of them) then waits for the
input gradient only; the pieces wait for the gate, so each shard's update
still runs after the backward pass read the weight. Any other gradient
(one made by another op, or read by more than its update: clipping,
summaries) is sliced after it is made.
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
