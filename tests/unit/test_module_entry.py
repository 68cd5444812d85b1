"""`python -m anydraft` is the `anydraft` command (the docs use both spellings)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_python_m_anydraft_lists_every_subcommand():
    from anydraft.cli import SUBCOMMANDS

    done = subprocess.run([sys.executable, "-m", "anydraft", "--help"], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    missing = [name for name in SUBCOMMANDS if name not in done.stdout]
    assert not missing, f"python -m anydraft --help does not list {missing}:\n{done.stdout}"
