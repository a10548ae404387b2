"""Warnings of the TensorFlow calls EPL wraps point at the user's line.

TensorFlow and Keras attribute a deprecation warning to their caller
(`warnings.warn(..., stacklevel=2)`, TensorFlow's "From file:line"). When
an EPL hook stands between the user's script and the TensorFlow call, that
caller is EPL's wrapper: the warning names EPL's file, and Python's
once-per-location filter shows it once for every call site of the script.
`as_user(function)` calls `function` from a frame that has the file,
line, module name and warning registry of the innermost user frame on the
stack, so its warnings read, and are filtered, exactly as without EPL.
"""
import os
import sys
import sysconfig
import types

_EPL_DIRECTORY = os.path.dirname(os.path.abspath(__file__))
# Files under these directories are library code, not the user's: EPL, the
# standard library and installed packages (TensorFlow, Keras).
_LIBRARY_DIRECTORIES = tuple(sorted({
    os.path.join(os.path.abspath(path), "")
    for path in [_EPL_DIRECTORY] + [sysconfig.get_paths()[key] for key in
                                    ("stdlib", "purelib", "platlib")]}))


def _forward(function, args, kwargs):
  return function(*args, **kwargs)


def is_user_file(filename):
  """Whether `filename` (a frame's or traceback's) is the user's code."""
  if filename.startswith("<"):
    return False
  return not os.path.abspath(filename).startswith(_LIBRARY_DIRECTORIES)


def _user_frame():
  frame = sys._getframe(2)  # pylint: disable=protected-access
  while frame is not None and not is_user_file(frame.f_code.co_filename):
    frame = frame.f_back
  return frame


def as_user(function):
  """`function`, called from the user's innermost frame on the stack at
  call time (directly when there is none)."""

  def call(*args, **kwargs):
    frame = _user_frame()
    if frame is None:
      return function(*args, **kwargs)
    code = _forward.__code__.replace(co_filename=frame.f_code.co_filename,
                                     co_firstlineno=frame.f_lineno - 1)
    forward = types.FunctionType(code, frame.f_globals)
    return forward(function, args, kwargs)
  return call
