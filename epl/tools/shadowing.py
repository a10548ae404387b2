"""A folder named `epl` (or a module `epl.py`) where a script runs, which
`import epl` takes for EPL.

Python puts the script's directory (the working directory for `python -m`)
first on `sys.path`. A folder `epl` there, such as a clone of this
repository or of the original EPL, is what `import epl` then finds: a
package of its own, or, without an `__init__.py`, a namespace package,
which wins over an editable install of EPL (found by setuptools' import
hook, after the path). The script then fails with `AttributeError: module
'epl' has no attribute 'init'`, before any EPL code runs; `epl-launch` and
`epl-plan` run EPL first, so they look before starting the script and say
what is wrong.

This module does not import TensorFlow (`epl-launch` does not).
"""
import importlib.machinery
import os
import sys

# The folder of the EPL package this process runs.
_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _is_epl(folder):
  """Whether `folder` is a copy of this EPL package (another checkout, on
  purpose first on the path), not a folder that merely has its name."""
  return all(os.path.isfile(os.path.join(folder, name))
             for name in ("__init__.py", "api.py"))


def shadowing_path(directory):
  """What `import epl` finds in a Python whose `sys.path` starts with
  `directory`, when that is not EPL: a folder without `__init__.py` (a
  namespace package), another package named epl, or a module `epl.py`.
  None otherwise."""
  spec = importlib.machinery.PathFinder.find_spec(
      "epl", [directory] + sys.path[1:])
  if spec is None:
    return None
  folders = list(spec.submodule_search_locations or [])
  if not folders:
    return spec.origin
  if any(_is_epl(folder) for folder in folders):
    return None
  return folders[0]


def error(path, how):
  """The message for `path`, found by the script run as `how`."""
  return (
      "%s: Python would import %s as `epl` instead of EPL (%s): "
      "it puts the script's directory (the working directory for `python "
      "-m`) first on sys.path, so the script would fail with \"module 'epl' "
      "has no attribute 'init'\". Rename or move it, or run the "
      "script from another directory." % (how, path, _OURS))
