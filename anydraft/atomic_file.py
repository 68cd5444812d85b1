"""Writing files so that a reader sees a whole file or none: a temp file beside the target, then os.replace."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import save_file


def _write_atomically(path: str | Path, write: Callable[[str], None]) -> None:
    """A crash or kill mid-write leaves at most a stray temp file, never a half-written `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp_name)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def save_safetensors_atomically(path: str | Path, tensors: dict[str, torch.Tensor],
                                metadata: dict[str, str] | None = None) -> None:
    _write_atomically(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))


def write_bytes_atomically(path: str | Path, data: bytes) -> None:
    _write_atomically(path, lambda tmp: Path(tmp).write_bytes(data))
