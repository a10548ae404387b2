"""Ops that pass tensors on unchanged, followed by structure.

An IdentityN's k-th output is its k-th input, whatever else it passes on
(Keras's optimizers pass every gradient through one IdentityN before their
updates); an Identity's output is its input. A pass that follows a
gradient to the op that reads it follows it through these, index by
index, instead of taking an op shared by several gradients as touching
all of them.
"""

PASS_THROUGH_TYPES = ("Identity", "IdentityN")


def behind_identity_n(tensor):
  """The tensor an IdentityN output passes on (its input of the same
  index), through any chain of IdentityN ops; `tensor` itself otherwise."""
  while tensor.op.type == "IdentityN":
    tensor = tensor.op.inputs[tensor.value_index]
  return tensor


def views(tensor):
  """`tensor` and every tensor that passes it on unchanged: the outputs of
  the Identity and IdentityN ops reading it (each at the index it reads
  `tensor` at), and theirs."""
  found, pending = [], [tensor]
  while pending:
    current = pending.pop()
    if any(current.name == seen.name for seen in found):
      continue
    found.append(current)
    for consumer in current.consumers():
      if consumer.type in PASS_THROUGH_TYPES:
        pending.extend(consumer.outputs[index]
                       for index, read in enumerate(consumer.inputs)
                       if read.name == current.name)
  return found
