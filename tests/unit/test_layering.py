"""Each heavy dependency has one home (DESIGN.md "Layers"): checked by parsing imports."""

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "dask_rl"

HOMES = {
    "dask": "runtime", "distributed": "runtime",
    "zarr": "checkpoint",
    "bokeh": "dashboard",
}
PURE = ("algos", "staleness")  # no Dask, no I/O libraries at all


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


MODULES = sorted(PKG.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PKG)))
def test_imports_stay_in_their_layer(path):
    rel = path.relative_to(PKG)
    top = rel.parts[0] if len(rel.parts) > 1 else ""
    for name in _imports(path):
        home = HOMES.get(name)
        if home is not None:
            assert top == home, f"{rel} imports {name}, which belongs in dask_rl/{home}/"
    if top in PURE:
        banned = {"dask", "distributed", "zarr", "bokeh", "fsspec", "gymnasium", "requests",
                  "socket", "subprocess"}
        assert not (_imports(path) & banned), f"{rel} must stay pure math"


def test_the_checker_catches_a_violation(tmp_path):
    bad = tmp_path / "x.py"
    bad.write_text("import os\nfrom distributed import Client\nimport zarr.storage\n")
    assert {"distributed", "zarr"} <= _imports(bad)
