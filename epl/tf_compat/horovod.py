"""Horovod (`horovod.tensorflow`), imported when the Horovod backend is used.

Horovod 0.28.1, its last release, builds from source against TF 2.15; it
does not build against TF 2.21.
"""

_INSTALL_HINT = (
    "communication.backend is \"horovod\" but Horovod cannot be imported "
    "(%s). Install it with TensorFlow support, e.g. `make horovod` in the "
    "EPL checkout, or `HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 pip "
    "install --no-build-isolation 'epl[horovod]'`; or use the default "
    "backend \"collective\".")


def horovod_api():
  """`horovod.tensorflow`, or an ImportError that says how to install it.

  Imported on first use only: Horovod is optional, and importing it loads
  its native library.
  """
  try:
    import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
  except ImportError as error:
    raise ImportError(_INSTALL_HINT % error) from error
  return hvd
