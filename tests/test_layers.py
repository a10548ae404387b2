"""EPL's package layers (the layout of issues 21 and 19).

A module imports only from its own layer or lower ones, at module top, and
only epl.tf_compat touches TensorFlow's and Keras' private API. These tests
read the source (ast), they import nothing of EPL but the public aliases.
"""
import ast
import os
import re
import runpy

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "epl")

# Lowest first, from epl/layers.py (read as a file: importing it would
# import EPL).
LAYERS = tuple(prefixes for prefixes, _ in runpy.run_path(
    os.path.join(PACKAGE, "layers.py"))["LAYERS"])
# TensorFlow and Keras private API: allowed in epl.tf_compat only.
PRIVATE_API = re.compile(
    r"tensorflow\.python|keras\.src|tf_keras\.src|tensorflow_estimator\.|"
    r"\._update_input\b|\._set_attr\b|\._add_control_input|"
    r"\._remove_all_control_inputs\b|\._set_device\b|_create_op_internal|"
    r"_from_c_op|\._control_outputs\b|\._is_ref_dtype\b|\._input_types\b|"
    r"\._default_original_op\b|\._get_function\b|\._names_in_use\b|"
    r"\._c_graph\b|\._mutation_lock\b|\._gradient_function")


def _modules():
  """{module name: path} of every module of the epl package."""
  modules = {}
  for directory, _, files in os.walk(PACKAGE):
    for name in files:
      if not name.endswith(".py"):
        continue
      path = os.path.join(directory, name)
      parts = os.path.relpath(path, ROOT)[:-len(".py")].split(os.sep)
      if parts[-1] == "__init__":
        parts.pop()
      modules[".".join(parts)] = path
  return modules


MODULES = _modules()


def layer_of(module):
  for index, prefixes in enumerate(LAYERS):
    for prefix in prefixes:
      if module == prefix or (prefix != "epl" and
                              module.startswith(prefix + ".")):
        return index
  raise AssertionError("%s is in no layer of LAYERS: add it." % module)


def _imported(node, module, is_package):
  """The epl modules an Import/ImportFrom node of `module` names."""
  if isinstance(node, ast.Import):
    return [alias.name for alias in node.names
            if alias.name.split(".")[0] == "epl"]
  if node.level:
    base = module.split(".")
    base = base[:len(base) - node.level + (1 if is_package else 0)]
    source = ".".join(base + ([node.module] if node.module else []))
  else:
    source = node.module or ""
  if source.split(".")[0] != "epl":
    return []
  # `from epl.parallel import engine` imports the module epl.parallel.engine.
  return [source + "." + alias.name
          if source + "." + alias.name in MODULES else source
          for alias in node.names]


def _imports(module):
  """[(imported epl module, line, at module top)] of `module`."""
  path = MODULES[module]
  with open(path) as source:
    tree = ast.parse(source.read(), path)
  top = set(map(id, tree.body))
  found = []
  for node in ast.walk(tree):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      for name in _imported(node, module, path.endswith("__init__.py")):
        found.append((name, node.lineno, id(node) in top))
  return found


def test_every_module_has_a_layer():
  for module in MODULES:
    layer_of(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_only_from_its_layer_or_lower(module):
  mine = layer_of(module)
  wrong = ["%s (line %d, layer %d)" % (name, line, layer_of(name))
           for name, line, _ in _imports(module)
           if layer_of(name) > mine]
  assert not wrong, "%s (layer %d) imports from higher layers: %s" % (
      module, mine, ", ".join(wrong))


@pytest.mark.parametrize("module", sorted(set(MODULES) - {"epl"}))
def test_epl_imports_are_at_module_top(module):
  # epl/__init__.py loads its public names lazily (PEP 562), so that
  # `import epl` alone does not import TensorFlow.
  nested = ["%s (line %d)" % (name, line)
            for name, line, at_top in _imports(module) if not at_top]
  assert not nested, "%s imports EPL inside a function or block: %s" % (
      module, ", ".join(nested))


def test_no_import_cycles():
  graph = {m: {name for name, _, _ in _imports(m)} for m in MODULES}
  done, path = set(), []

  def visit(module):
    if module in path:
      cycle = path[path.index(module):] + [module]
      raise AssertionError("import cycle: " + " -> ".join(cycle))
    if module in done:
      return
    path.append(module)
    for name in sorted(graph.get(module, ())):
      visit(name)
    path.pop()
    done.add(module)
  for module in sorted(graph):
    visit(module)


@pytest.mark.parametrize("module", sorted(
    m for m in MODULES if layer_of(m) != 0))
def test_private_tensorflow_api_only_in_tf_compat(module):
  with open(MODULES[module]) as source:
    lines = source.read().split("\n")
  found = ["line %d: %s" % (number, line.strip())
           for number, line in enumerate(lines, 1)
           if PRIVATE_API.search(line)]
  assert not found, (
      "%s uses TensorFlow/Keras private API outside epl.tf_compat (add a "
      "function there and a contract test to tests/test_tf_compat.py): %s" %
      (module, "; ".join(found)))


def test_tf_compat_imports_no_other_epl_module():
  for module in MODULES:
    if layer_of(module) == 0:
      others = [name for name, _, _ in _imports(module)
                if layer_of(name) != 0]
      assert not others, "%s imports %s" % (module, others)


def test_public_aliases_of_moved_modules():
  import epl  # pylint: disable=import-outside-toplevel
  assert epl.timeline.__name__ == "epl.tools.timeline"
  from epl.profiler import flops  # pylint: disable=import-outside-toplevel
  from epl.profiler.memory_profiler_hook import MemoryProfilerHook  # pylint: disable=import-outside-toplevel
  assert flops.__name__ == "epl.parallel.cost.flops"
  assert MemoryProfilerHook.__module__ == "epl.tools.memory_profiler_hook"


# A function longer than this is split into named steps (issue 36 item 5).
MAX_FUNCTION_LINES = 60


def test_no_function_over_max_lines():
  long_functions = []
  for module, path in sorted(MODULES.items()):
    with open(path) as source:
      tree = ast.parse(source.read(), path)
    for node in ast.walk(tree):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        lines = node.end_lineno - node.lineno + 1
        if lines > MAX_FUNCTION_LINES:
          long_functions.append("%s.%s (line %d): %d lines" % (
              module, node.name, node.lineno, lines))
  assert not long_functions, (
      "functions over %d lines (split them into named steps): %s" % (
          MAX_FUNCTION_LINES, "; ".join(long_functions)))


def test_passes_edit_graphs_through_ir_only():
  # epl.ir.graph_editor and epl.ir.control_flow give the passes the edits
  # of epl.tf_compat.graph_edit (issue 36 item 4).
  direct = sorted(module for module in MODULES
                  if module.startswith("epl.parallel.passes.") and any(
                      name == "epl.tf_compat.graph_edit"
                      for name, _, _ in _imports(module)))
  assert not direct, "passes that import epl.tf_compat.graph_edit: %s" % (
      ", ".join(direct))
