"""FLOPs profiling (the original's `FlopsProfilerHook` and `profile_flops`):
not built yet. The names exist so that scripts written for the original
import; using them raises at once."""

_NOT_BUILT = ("epl.profiler.flops.%s is not built yet in this EPL. Count "
              "FLOPs with tf.compat.v1.profiler.profile(graph, options="
              "tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()) "
              "meanwhile.")


def profile_flops(*args, **kwargs):
  """Not built yet: raises NotImplementedError."""
  del args, kwargs
  raise NotImplementedError(_NOT_BUILT % "profile_flops")


class FlopsProfilerHook:
  """Not built yet: constructing one raises NotImplementedError."""

  def __init__(self, *args, **kwargs):
    del args, kwargs
    raise NotImplementedError(_NOT_BUILT % "FlopsProfilerHook")
