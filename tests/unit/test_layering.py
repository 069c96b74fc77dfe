"""The layers of docs/architecture.md, checked by parsing every import of the package.

* each heavy dependency has one home (Dask in ``runtime/``, Zarr in ``checkpoint/``, Bokeh in
  ``dashboard/``, the CLI library in ``cli.py``);
* the pure layers (``algos/``, ``staleness/``, ``control/``, the config schema) import no
  cluster, storage, network or process library;
* a module imports only modules of its own layer or below;
* no import cycles between modules, counting imports inside functions too.
"""

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "dask_rl"

HOMES = {"dask": "runtime", "distributed": "runtime", "zarr": "checkpoint",
         "bokeh": "dashboard", "argparse": "cli.py", "tqdm": "cli.py",
         "mlflow": "tracking.py", "onnxruntime": "policy.py", "imageio": "policy.py",
         "optuna": "sweeps.py"}
PURE = ("algos", "staleness", "control", "config/schema.py")
IMPURE = {"dask", "distributed", "zarr", "bokeh", "fsspec", "gymnasium", "requests", "socket",
          "subprocess", "tornado"}

# Lowest first; a module's layer is that of the longest prefix naming it.
LAYERS = [
    ("shared data", ["dask_rl.config.schema", "dask_rl.data"]),
    ("environments and models", ["dask_rl.envs", "dask_rl.models"]),
    ("pure math", ["dask_rl.algos", "dask_rl.staleness"]),
    ("pipeline loading", ["dask_rl.config"]),
    ("run decisions", ["dask_rl.control"]),
    ("single-process building blocks", ["dask_rl.roles"]),
    ("heavy dependencies", ["dask_rl.checkpoint", "dask_rl.dashboard", "dask_rl.deploy",
                            "dask_rl.policy", "dask_rl.tracking"]),
    ("Dask runtime", ["dask_rl.runtime"]),
    ("entry points", ["dask_rl.api", "dask_rl.cli", "dask_rl.pool", "dask_rl.sweeps",
                      "dask_rl"]),
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _layer(module: str) -> int:
    best, rank = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    assert rank is not None, f"{module} is in no layer"
    return rank


def _imports(path: Path) -> tuple[set[str], set[str]]:
    """(top-level names of external imports, dask_rl modules imported), at any depth."""
    tree = ast.parse(path.read_text(), filename=str(path))
    external, internal = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                (internal if a.name.startswith("dask_rl") else external).add(
                    a.name if a.name.startswith("dask_rl") else a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != "dask_rl":
                external.add(node.module.split(".")[0])
                continue
            for a in node.names:  # `from dask_rl.algos import registry` imports a module
                sub = f"{node.module}.{a.name}"
                internal.add(sub if sub in MODULES else node.module)
    return external, internal


@pytest.mark.parametrize("module", sorted(MODULES))
def test_heavy_dependencies_stay_home_and_pure_layers_stay_pure(module):
    path = MODULES[module]
    rel = path.relative_to(PKG).as_posix()
    external, _ = _imports(path)
    for name in external:
        home = HOMES.get(name)
        if home is not None:
            assert rel == home or rel.startswith(home + "/"), \
                f"{rel} imports {name}, which belongs in dask_rl/{home}"
    if rel.startswith(PURE):
        assert not external & IMPURE, f"{rel} must stay pure, imports {external & IMPURE}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_the_layers(module):
    _, internal = _imports(MODULES[module])
    mine = _layer(module)
    for other in internal:
        assert _layer(other) <= mine, (
            f"{module} ({LAYERS[mine][0]}) imports {other} ({LAYERS[_layer(other)][0]}), "
            f"a layer above it")


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of two or more nodes: the import cycles."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycles():
    graph = {m: {o for o in _imports(p)[1] if o in MODULES and o != m}
             for m, p in MODULES.items()}
    assert not _cycles(graph), f"import cycles: {_cycles(graph)}"


def test_the_checkers_catch_violations(tmp_path):
    bad = tmp_path / "x.py"
    bad.write_text("import os\nfrom distributed import Client\n"
                   "def f():\n    import zarr.storage\n    from dask_rl.runtime import tasks\n")
    external, internal = _imports(bad)
    assert {"distributed", "zarr"} <= external
    assert internal == {"dask_rl.runtime.tasks"}
    assert _layer("dask_rl.algos.ppo") < _layer("dask_rl.runtime.tasks")
    assert _layer("dask_rl.config.schema") < _layer("dask_rl.config.loader")
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
