"""Automatic choice of gradient checkpoints (gradient_checkpoint.type "auto").

Repeated blocks first: name scopes at the same depth whose forward ops have
the same multiset of op types (transformer layers `layer_0`, `layer_1`,
...) and at least gradient_checkpoint.min_block_ops ops (MIN_BLOCK_OPS, 8,
by default: smaller scopes are single layers, whose outputs are no better
checkpoints than any other tensor) are blocks; each block's output, the last tensor it hands to the ops
after it, is a checkpoint. Without repeated blocks, about sqrt(n) tensors
are picked along the forward pass, at equal steps of the bytes its
activations take, so each recomputed piece is about as large.
"""
import collections
import logging
import math

from epl.tf_compat import graph_edit

logger = logging.getLogger("epl")

MIN_REPEATS = 2     # a block signature must occur this often
# and a block have this many ops, to count: the default of
# gradient_checkpoint.min_block_ops (auto parallel's block boundaries use it
# as it is).
MIN_BLOCK_OPS = 8
_MAX_DEPTH = 20


def _scope(op, depth):
  parts = op.name.split("/")
  return "/".join(parts[:depth]) if len(parts) > depth else None


def repeated_blocks(forward_ops, min_block_ops=MIN_BLOCK_OPS):
  """[[ops of one block], ...] in order of first op: name scopes (shallowest
  first) of at least `min_block_ops` ops whose op-type counts repeat at
  least MIN_REPEATS times."""
  taken = []
  blocks = []
  for depth in range(1, _MAX_DEPTH + 1):
    scopes = collections.OrderedDict()
    for op in forward_ops:
      scope = _scope(op, depth)
      if scope is None or any(scope.startswith(t + "/") or scope == t
                              for t in taken):
        continue
      scopes.setdefault(scope, []).append(op)
    by_signature = collections.defaultdict(list)
    for scope, ops in scopes.items():
      if len(ops) >= min_block_ops:
        # Casts are left out: mixed precision may cast the first or last
        # block's inputs or outputs differently.
        signature = tuple(sorted(collections.Counter(
            op.type for op in ops if op.type != "Cast").items()))
        by_signature[signature].append(scope)
    for signature, names in by_signature.items():
      if len(names) >= MIN_REPEATS:
        taken.extend(names)
        blocks.extend(scopes[name] for name in names)
  return sorted(blocks, key=lambda ops: min(map(graph_edit.creation_index,
                                                ops)))


def block_output(ops, forward_names):
  """The last tensor of block `ops` that a forward op outside it reads."""
  names = {op.name for op in ops}
  outputs = [t for op in ops for t in op.outputs
             if t.dtype.is_floating and any(
                 c.name in forward_names and c.name not in names
                 for c in t.consumers())]
  if not outputs:
    return None
  return max(outputs, key=lambda t: graph_edit.creation_index(t.op))


def _bytes(tensor):
  dims = [d if d is not None else 1 for d in (tensor.shape.as_list()
                                              if tensor.shape.rank is not None
                                              else [])]
  return tensor.dtype.size * math.prod(dims)


def balanced_cut(forward_ops):
  """About sqrt(n) float outputs of `forward_ops` (in order), one at each
  step of 1/(k+1) of the bytes of all their outputs."""
  tensors = [t for op in forward_ops for t in op.outputs
             if t.dtype.is_floating and t.consumers()]
  count = int(math.sqrt(len(tensors)))
  if count == 0:
    return []
  total = sum(_bytes(t) for t in tensors)
  step = total / (count + 1)
  chosen, running, next_cut = [], 0, step
  for tensor in tensors:
    running += _bytes(tensor)
    if running >= next_cut and len(chosen) < count:
      chosen.append(tensor)
      next_cut += step
  return chosen


def search(forward_ops, min_block_ops=MIN_BLOCK_OPS):
  """Checkpoint tensors for `forward_ops` (topologically ordered); blocks
  have at least `min_block_ops` ops."""
  forward_names = {op.name for op in forward_ops}
  blocks = repeated_blocks(forward_ops, min_block_ops)
  outputs = [block_output(ops, forward_names) for ops in blocks]
  outputs = [t for t in outputs if t is not None]
  if outputs:
    logger.info("Gradient checkpointing (auto): %d repeated blocks of at "
                "least %d ops (gradient_checkpoint.min_block_ops), one "
                "checkpoint each", len(outputs), min_block_ops)
    return outputs
  chosen = balanced_cut(forward_ops)
  # With no block at the threshold, every repeated scope is under it.
  smaller = [] if blocks else repeated_blocks(forward_ops, 1)
  logger.info("Gradient checkpointing (auto): no repeated blocks of at "
              "least %d ops (gradient_checkpoint.min_block_ops); %d "
              "repeated block(s) fell under it%s; %d checkpoints balanced by "
              "activation bytes", min_block_ops, len(smaller),
              " (the largest of %d ops)" % max(map(len, smaller))
              if smaller else "", len(chosen))
  return chosen
