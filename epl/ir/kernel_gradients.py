"""The MatMul that makes a dense kernel's gradient, found by the graph's
structure: `MatMul(x, dy, transpose_a)`, possibly behind the Identity of
the gate `minimize` puts on one op's gradients (tf.tuple). ZeRO v3's plan
reads its inputs' shapes to choose how shard gradients are made, and its
rewrite builds the shards from those inputs; local sums over replicas
build the sum of such gradients as one product over the concatenated
batches.
"""
from epl.ir import graph_editor


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


def kernel_products(tensors, leaving):
  """[(MatMul, its gates)] that make each of `tensors` as a kernel's
  gradient read only by the ops named in `leaving`; None unless every
  one is."""
  products = [product_behind(t, leaving) for t in tensors]
  if any(p is None or not is_kernel_gradient(p[0]) for p in products):
    return None
  return products


def factors_smaller(products):
  """Whether every MatMul of `products` reads factors (x, dy) of known
  size, fewer elements together than the product it makes: then moving
  the factors to one device moves less than moving the product."""
  for matmul, _ in products:
    sizes = [t.shape.num_elements() for t in list(matmul.inputs[:2]) +
             [matmul.outputs[0]]]
    if None in sizes or sizes[0] + sizes[1] >= sizes[2]:
      return False
  return True


def ungated(products):
  """Takes each MatMul of `products` out of its gates (a product built
  in its place waits for them instead, so it still runs after backward
  read the weight); returns those gates."""
  gates = []
  for matmul, own_gates in products:
    for gate in own_gates:
      graph_editor.remove_control_input(gate, matmul)
    gates.extend(g for g in own_gates if g is not matmul)
  return gates
