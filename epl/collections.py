"""Collections of tensors whose fetches come back merged over replicas."""
import tensorflow as tf


class GraphKeys:
  """Collection names. A tensor added with `epl.add_to_collection` under
  one of these is returned, when fetched, merged over every replica (and
  micro-batch): averaged, summed, or concatenated along the first axis."""
  GLOBAL_MEAN_OBJECTS = "global_mean_objects"
  GLOBAL_SUM_OBJECTS = "global_sum_objects"
  GLOBAL_CONCAT_OBJECTS = "global_concat_objects"


_KEYS = (GraphKeys.GLOBAL_MEAN_OBJECTS, GraphKeys.GLOBAL_SUM_OBJECTS,
         GraphKeys.GLOBAL_CONCAT_OBJECTS)


class UnknownCollectionError(KeyError, ValueError):
  """A collection name that is not one of epl.GraphKeys (the original EPL
  raised KeyError)."""

  def __str__(self):
    return self.args[0]


def add_to_collection(tensors, key):
  """Adds `tensors` (a tf.Tensor or a list of them) to the EPL collection
  `key` of their graph."""
  if key not in _KEYS:
    raise UnknownCollectionError(
        "Unknown EPL collection %r; use one of epl.GraphKeys: %s." %
        (key, ", ".join(_KEYS)))
  tensors = list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]
  for tensor in tensors:
    if not isinstance(tensor, tf.Tensor):
      raise ValueError("epl.add_to_collection expects a tf.Tensor or a list "
                       "of them, got %r." % (tensor,))
  for tensor in tensors:
    tensor.graph.add_to_collection(key, tensor)


def get_collection(key, graph=None):
  """The tensors of EPL collection `key` in `graph` (default graph)."""
  graph = graph or tf.compat.v1.get_default_graph()
  return graph.get_collection(key)
