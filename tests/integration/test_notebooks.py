"""Both notebooks execute top to bottom (small budgets)."""

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]


@pytest.mark.parametrize("name", ["quickstart.ipynb", "population.ipynb"])
def test_notebook_runs(name, tmp_path):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    # run from a copy of the notebooks folder's location, so relative paths resolve
    workdir = tmp_path / "notebooks"
    workdir.mkdir()
    (tmp_path / "pipelines").symlink_to(NOTEBOOKS.parent / "pipelines")
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(workdir)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
