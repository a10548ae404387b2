"""Size-balanced partitions, shared by ZeRO (which replica owns which
variable) and grouped apply (which variables are updated together)."""
import tensorflow as tf



def balanced_partition(sizes, count):
  """Splits the indices of `sizes` into `count` lists of about equal total.

  Greedy: the largest item goes to the lightest list so far (ties to the
  first). Each list keeps its indices in order; with fewer items than
  `count`, some lists are empty. Deterministic, so every worker building
  the same graph gets the same partition.
  """
  totals = [0] * count
  parts = [[] for _ in range(count)]
  for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
    lightest = min(range(count), key=lambda p: (totals[p], p))
    parts[lightest].append(index)
    totals[lightest] += sizes[index]
  return [sorted(part) for part in parts]


def variable_size(variable_op):
  """Elements of the variable made by `variable_op` (VarHandleOp or
  VariableV2); 1 when its shape is not fully known."""
  if variable_op.type == "VarHandleOp":
    shape = tf.TensorShape(variable_op.get_attr("shape"))
  else:
    shape = variable_op.outputs[0].shape
  return shape.num_elements() or 1 if shape.is_fully_defined() else 1
