"""The peers' virtual environments, built by the benchmark itself (``benchmarks/peers.py``).

Each peer gets its own: Sample Factory 2.1.1 pins ``numpy<2`` and ``gymnasium<1.0``, RLlib pins
its own gymnasium; torch 2.13.0 goes in first everywhere (the CPU build already on the machine),
so that no peer pulls a CUDA build. A venv is built once under ``--venvs`` and reused while its
requirements are unchanged (a stamp file holds them).

    python benchmarks/peer_venvs.py            # build every peer's venv, print versions
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

DEFAULT_ROOT = Path(os.environ.get("DASK_RL_PEERS", Path.home() / ".cache" / "dask-rl-peers"))
TORCH = "torch==2.13.0"
# what each peer's users install (their docs), after torch; versions recorded per run
REQUIREMENTS = {
    "rllib": ["ray[rllib]==2.60.0", "psutil", "gymnasium[mujoco]"],
    "sample_factory": ["sample-factory==2.1.1", "gymnasium[mujoco]<1.0", "mujoco<3.4"],
}
PACKAGES = {"rllib": ["ray", "gymnasium", "numpy", "torch", "mujoco"],
            "sample_factory": ["sample-factory", "gymnasium", "numpy", "torch", "mujoco"]}


def python(peer: str, root: Path = DEFAULT_ROOT) -> Path:
    return root / peer / "bin" / "python"


def build(peer: str, root: Path = DEFAULT_ROOT, *, log=sys.stderr) -> Path:
    """The peer's venv python, built if missing or its requirements changed."""
    where = root / peer
    stamp = where / "dask-rl-requirements.json"
    wanted = [TORCH, *REQUIREMENTS[peer]]
    if stamp.exists() and json.loads(stamp.read_text()) == wanted:
        return python(peer, root)
    print(f"building {peer}'s venv in {where} ({' '.join(wanted)})", file=log, flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(where)], check=True)
    pip = [str(python(peer, root)), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, TORCH], check=True)
    subprocess.run([*pip, *REQUIREMENTS[peer]], check=True)
    stamp.write_text(json.dumps(wanted))
    return python(peer, root)


def versions(peer: str, root: Path = DEFAULT_ROOT) -> dict[str, str]:
    """The installed versions of what matters in the peer's venv."""
    code = ("import json, importlib.metadata as m, sys; print(json.dumps({p: m.version(p) "
            "for p in sys.argv[1:]}))")
    out = subprocess.run([str(python(peer, root)), "-c", code, *PACKAGES[peer]],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venvs", type=Path, default=DEFAULT_ROOT)
    ap.add_argument("peers", nargs="*", default=list(REQUIREMENTS))
    args = ap.parse_args()
    for peer in args.peers:
        build(peer, args.venvs)
        print(peer, versions(peer, args.venvs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
