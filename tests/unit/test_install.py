"""What a fresh install needs: extras that match the pipelines, the README and the image.

A pipeline whose environment family's extra is missing must stop with one line naming the
extra (exit 2) before any cluster starts; the tests hide an installed module from a fresh
interpreter to show it.
"""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib

from dask_rl.config import load_pipeline
from dask_rl.envs import env_family

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = sorted((ROOT / "pipelines").glob("*.yaml"))


def _extras() -> dict[str, list[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["optional-dependencies"]


def _requires(extra: str) -> set[str]:
    """Extras a self-reference such as ``dask-rl[atari,mujoco]`` pulls in."""
    out = set()
    for req in _extras()[extra]:
        m = re.fullmatch(r"dask-rl\[([a-z0-9,\s-]+)\]", req)
        if m:
            out |= {e.strip() for e in m.group(1).split(",")}
    return out


def test_the_test_extra_installs_every_environment_family():
    assert {"atari", "mujoco", "k8s"} <= _requires("test")


def test_environment_extras_carry_gymnasiums_own_extras():
    # gymnasium[mujoco] brings imageio, which Gymnasium's MuJoCo package imports at load time.
    assert any(r.startswith("gymnasium[mujoco]") for r in _extras()["mujoco"])
    assert any(r.startswith("gymnasium[atari]") for r in _extras()["atari"])


def test_the_dockerfile_installs_every_extra_but_test():
    text = (ROOT / "k8s" / "Dockerfile").read_text()
    lines = re.findall(r'pip install "\.\[([a-z0-9,]+)\]"', text)
    assert len(lines) == 1, "the Dockerfile should install the project once, with its extras"
    assert set(lines[0].split(",")) == set(_extras()) - {"test"}


@pytest.mark.parametrize("path", PIPELINES, ids=lambda p: p.name)
def test_the_readme_names_each_pipelines_extra(path):
    family = env_family(load_pipeline(path).env)
    rows = [line for line in (ROOT / "README.md").read_text().splitlines()
            if line.startswith(f"| `{path.name}` |")]
    assert len(rows) == 1, f"README's pipeline table has no row of its own for {path.name}"
    extra = rows[0].rstrip(" |").rsplit("|", 1)[1].strip()
    assert extra == (f"`{family}`" if family else "-")
    if family:
        assert family in _extras()


_BLOCK = textwrap.dedent("""
    import importlib.abc, sys
    BLOCKED = set(sys.argv[1].split(","))
    class Hide(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, Hide())
    from dask_rl.cli import main
    code = main(["train", sys.argv[2], "--run-dir", sys.argv[3]])
    print("distributed imported:", "distributed" in sys.modules)
    sys.exit(code)
""")


@pytest.mark.parametrize("pipeline, hidden, extra", [
    ("ppo_hopper_stellaris.yaml", "imageio", "mujoco"),
    ("es_halfcheetah.yaml", "mujoco", "mujoco"),
    ("ppo_pong.yaml", "cv2", "atari"),
    ("impact_pong.yaml", "ale_py", "atari"),
])
def test_a_missing_extra_is_one_line_and_exit_2_before_a_cluster(tmp_path, pipeline, hidden,
                                                                  extra):
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", _BLOCK, hidden,
                           str(ROOT / "pipelines" / pipeline), str(run_dir)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert f"pip install 'dask-rl[{extra}]'" in proc.stderr
    assert hidden in proc.stderr
    assert "distributed imported: False" in proc.stdout  # no cluster was started
    assert not run_dir.exists()
