"""The package's layering: code generation runs nothing, so it imports nothing of the runtime."""
import ast
import pathlib

import pytest

import fxflash

PACKAGE = pathlib.Path(fxflash.__file__).parent


def _imports(path: pathlib.Path) -> set:
    """The fxflash subpackages a module imports, relative imports resolved."""
    found = set()
    depth = len(path.relative_to(PACKAGE).parts) - 1  # 1 for a module of a subpackage
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(path.relative_to(PACKAGE).parts[:depth - node.level + 1])
            elif node.module and node.module.startswith("fxflash"):
                base, node.module = [], node.module.removeprefix("fxflash").lstrip(".") or None
            else:
                continue
            if node.module:
                found.add([*base, *node.module.split(".")][0])
            else:  # from .. import runtime: the names are modules
                found.update(([*base, alias.name])[0] for alias in node.names)
    return found


@pytest.mark.fusion_independent
@pytest.mark.parametrize("package, forbidden", [("codegen", {"runtime"}), ("tile", {"codegen", "runtime"}),
                                                ("patterns", {"codegen", "runtime", "tile"})])
def test_a_stage_imports_nothing_of_the_stages_after_it(package, forbidden):
    for module in (PACKAGE / package).glob("*.py"):
        assert not _imports(module) & forbidden, module.name
