"""The MatMul that makes a dense kernel's gradient, found by the graph's
structure: `MatMul(x, dy, transpose_a)`, possibly behind the Identity of
the gate `minimize` puts on one op's gradients (tf.tuple). ZeRO v3's plan
reads its inputs' shapes to choose how shard gradients are made, and its
rewrite builds the shards from those inputs.
"""


def product_behind(tensor, leaving):
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


def is_kernel_gradient(matmul):
  """Whether `matmul` is laid out as a kernel's gradient: x transposed,
  dy not (the rows of the product are the columns of x)."""
  return bool(matmul.get_attr("transpose_a")) and not matmul.get_attr(
      "transpose_b")
