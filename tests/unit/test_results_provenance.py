"""Every results file says which code it ran on: its own ``commit``, or (written before the
scripts recorded it) a row of the table in ``docs/benchmarks.md`` naming the commit."""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_results_file_names_its_commit():
    doc = (ROOT / "docs" / "benchmarks.md").read_text()
    missing = []
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and ("commit" in data or "commits" in data):
            continue
        if f"| `{path.name}` | `" not in doc:
            missing.append(path.name)
    assert not missing, f"no commit recorded or listed in docs/benchmarks.md: {missing}"
