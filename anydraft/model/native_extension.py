"""The native kernels (csrc/*.cpp): when a model can use them, building them once, the decoder body's call.

On a CPU with AVX-512, or AVX2 with FMA (csrc/vec16.h), a Llama-family body in bf16 runs as one C++ call instead
of ~50 PyTorch calls per layer, and every row is computed the same way whatever the batch shape, so greedy
speculative decoding is token-exact against the target alone in bf16. The screened output heads (NativeHead)
need AVX-512 with VNNI; elsewhere the head's logits come from the body's linear kernel (NativeLinear). The
extension is compiled on first use (about a minute, g++) into a folder keyed by its source, torch version, CPU
model and CPU feature flags ($ANYDRAFT_NATIVE_DIR, else ~/.cache/anydraft/native); when it cannot be used the
PyTorch path runs. ANYDRAFT_NATIVE=0 turns it off.
A build is tried once per process; a failure is reported once on stderr with the compiler's message.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import platform
import shutil
import sys
import sysconfig
from pathlib import Path

import torch

from ..atomic_file import write_bytes_atomically
from .config import ModelConfig
from .packed_linear import TileLinear

CSRC = Path(__file__).with_name("csrc")
BODY_SOURCES = ("bindings.cpp", "decoder.cpp", "head_logits.cpp", "row_logprobs.cpp")
# The screened output heads: an int8 copy of the head scored with AVX512-VNNI (NativeHead); AVX-512 builds only.
SCREENED_HEAD_SOURCES = ("greedy_head.cpp", "sampling_head.cpp", "top_head.cpp", "proposal_head.cpp")
WIDTH = 16   # the kernels work on 16 floats at a time: hidden, head and MLP sizes must be multiples


def cpu_has(flag: str) -> bool:
    """Whether /proc/cpuinfo lists this CPU flag (e.g. avx512_vnni)."""
    return flag in _cpuinfo("flags").split()


@functools.lru_cache(maxsize=None)
def _cpuinfo(field: str) -> str:
    """The first /proc/cpuinfo line of this field, after its colon ('' where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def why_not_hardware() -> str | None:
    """None when this CPU can run the native body; else the reason. The only reason a test may skip it."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the native kernels are for x86-64 CPUs (this one is {platform.machine()})"
    if not (has_avx512() or (cpu_has("avx2") and cpu_has("fma"))):
        return "this CPU lacks both AVX-512 (avx512f, avx512bw) and AVX2 with FMA"
    return None


def has_avx512() -> bool:
    """Whether the build targets AVX-512 (then the screened heads are built too); else AVX2 (csrc/vec16.h)."""
    return cpu_has("avx512f") and cpu_has("avx512bw")


def why_not_screened_head() -> str | None:
    """None when this CPU can run the screened native heads (NativeHead); else the reason."""
    hardware = why_not_hardware()
    if hardware is not None:
        return hardware
    if not has_avx512():
        return "this CPU lacks AVX-512 (avx512f, avx512bw)"
    if not cpu_has("avx512_vnni"):
        return "this CPU lacks AVX512-VNNI"
    return None


def _build_dir() -> Path:
    """Keyed by what changes the binary: source, torch version, compiler target (-march=native: CPU model and
    feature flags; a VM can hide AVX-512 under the same model name, and that binary would die on SIGILL)."""
    cpu = (_cpuinfo("model name") or platform.processor()) + "|" + " ".join(sorted(_cpuinfo("flags").split()))
    # every file of csrc/ (headers too: torch's loader would not notice a changed header)
    source = b"".join(path.read_bytes() for path in sorted(CSRC.iterdir()) if path.suffix in (".cpp", ".h"))
    key = hashlib.sha256(source + torch.__version__.encode() + cpu.encode()).hexdigest()[:16]
    configured = os.environ.get("ANYDRAFT_NATIVE_DIR")
    return (Path(configured) if configured else Path.home() / ".cache" / "anydraft" / "native") / key


@contextlib.contextmanager
def _ninja_on_path():
    """torch's loader runs `ninja` from PATH; the `ninja` package's binary sits in the environment's scripts
    folder, which is not on PATH when the environment is used without being activated."""
    folders = []
    try:
        import ninja   # the PyPI package (a dependency): ships the binary
        folders.append(ninja.BIN_DIR)
    except ImportError:
        pass
    folders += [sysconfig.get_path("scripts"), str(Path(sys.executable).parent)]
    old = os.environ.get("PATH", "")
    found = next((f for f in folders if shutil.which("ninja", path=f)), None)
    if found is None or shutil.which("ninja", path=old):
        yield
        return
    os.environ["PATH"] = found + os.pathsep + old
    try:
        yield
    finally:
        os.environ["PATH"] = old


class BuildFailed(RuntimeError):
    """The native extension did not build in this process (not retried); the message is the compiler's."""


@functools.lru_cache(maxsize=1)
def _build():
    """(module, None) or (None, the failure): one attempt per process, the failure reported once on stderr."""
    try:
        return _compile(), None
    except Exception as e:   # a missing compiler or a failed build must not stop decoding
        failure = BuildFailed(f"{type(e).__name__}: {e}".strip())
        lines = str(failure).splitlines()
        shown = "\n".join(lines if len(lines) <= 60 else lines[:10] + ["..."] + lines[-50:])
        print(f"anydraft: the native kernels did not build; the PyTorch path runs instead. Reason:\n{shown}",
              file=sys.stderr, flush=True)
        return None, failure


def load_extension():
    """The compiled module, or raises BuildFailed with the build's reason (the same one for the whole process)."""
    module, failure = _build()
    if failure is not None:
        raise failure
    return module


def _compile():
    from torch.utils.cpp_extension import load   # imported lazily: it is slow and only needed here
    build_dir = _build_dir()
    build_dir.mkdir(parents=True, exist_ok=True)
    if not any(build_dir.glob("anydraft_native*.so")):   # say why the first model load takes a minute
        print(f"anydraft: compiling the native kernels for this CPU (first use, about a minute) into {build_dir}",
              file=sys.stderr, flush=True)
    flags = ["-O3", "-march=native", "-fopenmp"]
    import fcntl   # POSIX only, like the kernels themselves
    with open(build_dir / "anydraft.lock", "w") as guard, _ninja_on_path():
        # torch's own lock file stays behind when a build is killed (Ctrl-C in the first minute), and every later
        # load would then wait on it forever. Ours is a flock, which the OS releases when its holder dies: while
        # we hold it no other anydraft process is building here, so a torch lock file found now is stale.
        fcntl.flock(guard, fcntl.LOCK_EX)
        (build_dir / "lock").unlink(missing_ok=True)
        sources = _sources_in(build_dir)
        return load(name="anydraft_native", sources=[str(path) for path in sources], build_directory=str(build_dir),
                    extra_cflags=flags, extra_ldflags=["-fopenmp"], verbose=False)


def _sources_in(build_dir: Path) -> list[Path]:
    """The sources compiled from copies inside the build folder (whose name is their content's hash): the build
    file names source paths, so two checkouts with the same sources would otherwise each rebuild over the
    other's binary. A copy is written only when missing, keeping its time stamp for ninja."""
    folder = build_dir / "src"
    folder.mkdir(exist_ok=True)
    for path in CSRC.iterdir():
        if path.suffix in (".cpp", ".h") and not (folder / path.name).exists():
            write_bytes_atomically(folder / path.name, path.read_bytes())
    return [folder / path.name for path in build_sources()]


def build_sources() -> list[Path]:
    """The csrc files this CPU's build compiles: the body's, and the screened heads' on AVX-512."""
    return [CSRC / name for name in BODY_SOURCES + (SCREENED_HEAD_SOURCES if has_avx512() else ())]


def why_not_native(cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> str | None:
    """None when the native body can run this model here; else the reason, in words."""
    if os.environ.get("ANYDRAFT_NATIVE", "1") == "0":
        return "turned off by ANYDRAFT_NATIVE=0"
    if torch.device(device).type != "cpu" or dtype != torch.bfloat16:
        return f"only for bfloat16 on CPU (here {dtype} on {torch.device(device).type})"
    hardware = why_not_hardware()
    if hardware is not None:
        return hardware
    sizes = {"hidden_size": cfg.hidden_size, "head_dim": cfg.head_dim, "intermediate_size": cfg.intermediate_size}
    odd = [f"{name}={value}" for name, value in sizes.items() if value % WIDTH]
    if odd:
        return f"sizes must be multiples of {WIDTH}: {', '.join(odd)}"
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        return "attention heads must be a multiple of key/value heads"
    _, failure = _build()
    if failure is not None:   # the full message went to stderr once; the reason here is its first line
        return f"the extension did not build ({str(failure).splitlines()[0]})"
    return None


class NativeDecoder:
    """A model's decoder body as one native call. Holds the model's bf16 weights, each packed once into the tile
    layout its kernels read (AMX tiles or AVX-512 vectors) with the model keeping only that copy (a TileLinear);
    a weight of odd width is shared as it is. Raises ValueError for a layout it cannot run."""

    def __init__(self, model) -> None:
        cfg = model.cfg
        self.cfg = cfg
        self.extension = load_extension()
        empty = torch.empty(0, dtype=torch.bfloat16)
        tensors: list[torch.Tensor] = []
        for layer in model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            if attn.qkv_proj is None or not hasattr(mlp, "fused_weights"):
                raise ValueError(f"layer {attn.layer_idx} is not in the fused inference layout "
                                 f"(call model.fuse_projections(); MLPs must offer fused_weights())")
            gate_up, down = self._mlp_weights(mlp)
            intermediate = down.shape[1] * (2 if down.dim() == 4 else 1)
            if intermediate % WIDTH:
                raise ValueError(f"layer {attn.layer_idx}: MLP rows {intermediate} not a multiple of {WIDTH}")
            qkv_bias = attn.qkv_proj.bias
            tensors += [layer.input_layernorm.weight, self._body_weight(attn, "qkv_proj"),
                        empty if qkv_bias is None else qkv_bias,
                        empty if attn.qk_norm_weight is None else attn.qk_norm_weight,
                        self._body_weight(attn, "o_proj"), layer.post_attention_layernorm.weight,
                        self._body_weight(mlp, "gate_up_proj", gate_up), self._body_weight(mlp, "down_proj", down)]
        self.layer_tensors = [t.detach().contiguous() for t in tensors]
        self.final_norm = model.model.norm.weight.detach().contiguous()
        self.embed = model.model.embed_tokens.weight.detach().contiguous()
        self.inv_freq = model._inv_freq.float().contiguous()

    @staticmethod
    def _mlp_weights(mlp) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate_up [2I, H], down [H, I]), or their packed forms where an earlier NativeDecoder packed them."""
        held = [getattr(mlp, name, None) for name in ("gate_up_proj", "down_proj")]
        if all(isinstance(linear, TileLinear) for linear in held):
            return held[0].packed, held[1].packed
        return mlp.fused_weights()

    def _body_weight(self, owner: torch.nn.Module, name: str, weight: torch.Tensor | None = None) -> torch.Tensor:
        """The weight the body reads (`weight`, default: module `name` of `owner`'s): packed into the tile layout
        (itself at an odd width). A module holding that weight becomes a TileLinear holding only the packed copy
        (a second NativeDecoder on the model then reads that)."""
        linear = getattr(owner, name, None)
        if isinstance(linear, TileLinear):
            return linear.packed
        weight = linear.weight if weight is None else weight
        packed = self.extension.pack_body_weight(weight.detach())
        if packed is None:
            return weight
        if isinstance(linear, torch.nn.Linear) and linear.weight is weight:
            setattr(owner, name, TileLinear(packed, linear.bias, linear.out_features))
        return packed

    can_capture = True   # returns the residual stream at chosen layers too (ModelRunner.capture_hidden_states)

    def __call__(self, input_ids: torch.Tensor, cache, slots: list[int], positions: list[int],
                 capture_layers: list[int] | None = None):
        """input_ids [B, S] -> hidden [B, S, H] after the final norm; writes token m = b * S + s's k/v into
        `cache` at (slots[m], positions[m]) through its block table (KVCache.host_positions), one slot and position per token, so several
        rows' tokens may share a batch row (a ragged prefill). With capture_layers, returns (hidden, the residual
        stream at the input of those layers [B, S, len * H]), as CausalLM.forward does."""
        cfg = self.cfg
        layers = capture_layers or []
        captured = torch.empty((*input_ids.shape, len(layers) * cfg.hidden_size) if layers else (0,),
                               dtype=torch.bfloat16)
        hidden = self.extension.decoder_forward(input_ids, self.embed, self.layer_tensors, self.final_norm, cache.k,
                                                cache.v, cache.block_table, slots, positions, self.inv_freq,
                                                cfg.num_attention_heads,
                                                cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps, captured,
                                                layers)
        return hidden if capture_layers is None else (hidden, captured)
