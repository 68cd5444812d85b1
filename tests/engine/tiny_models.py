"""Tiny random checkpoints on the real tokenizers, references, and the LLM cache the engine tests share.

Every checkpoint is a real HF directory (config.json, model.safetensors, tokenizer files), so the tests
load them the way users do: LLM(model=dir, speculative_config={"model": dir, ...}).
Drafts that agree with the target only partly are the target's own weights plus noise; a draft with a
shuffled vocabulary is the target with its token ids permuted (tokenizer and weight rows alike).
"""
from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file

from anydraft.model.config import ModelConfig
from anydraft.model.llama import CausalLM

if TYPE_CHECKING:
    from anydraft.tokenizer import Tokenizer

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
TOKENIZERS = SHARED / "tokenizers"
GSM8K_TEST = SHARED / "data" / "gsm8k" / "test.jsonl"
SMALL_HEAD_SCALE, SMALL_NOISE = 8.0, 0.2
EOS_PROMPT = "Question: Tom has 3 apples and buys 5 more. How many apples does he have?\nAnswer:"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


# -- checkpoints ----------------------------------------------------------------------------------------------
def copy_tokenizer(tokenizer_dir: Path, directory: Path) -> None:
    for name in TOKENIZER_FILES:
        if (Path(tokenizer_dir) / name).exists():
            shutil.copy(Path(tokenizer_dir) / name, directory / name)


@functools.lru_cache(maxsize=None)
def tokenizer_of(directory) -> "Tokenizer":
    """Parsed once per directory (qwen3's takes about a second)."""
    from anydraft.tokenizer import Tokenizer
    return Tokenizer.from_dir(directory)


def write_checkpoint(directory: Path, cfg: ModelConfig, state: dict[str, torch.Tensor], tokenizer_dir: Path | None,
                     d2t_tensors: dict[str, torch.Tensor] | None = None) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=1))
    state = {name: t.detach().contiguous().clone() for name, t in state.items()}
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(directory / "model.safetensors"))
    if d2t_tensors is not None:
        save_file({k: v.contiguous() for k, v in d2t_tensors.items()}, str(directory / "d2t.safetensors"))
    if tokenizer_dir is not None:
        copy_tokenizer(tokenizer_dir, directory)
    return directory


def make_checkpoint(directory, architecture: str, tokenizer_dir, vocab_rows: int, hidden: int, layers: int,
                    heads: int, kv_heads: int, seed: int, head_scale: float = 1.0, tie: bool = False) -> Path:
    """A random Llama-family checkpoint (float32 weights) with a copy of the tokenizer.

    head_scale multiplies the output head: large values make the next-token distribution peaked, so a
    handful of tokens carry most of the mass (what the sampling tests need). EOS in config.json is the
    tokenizer's EOS set, so transformers' generate stops where the engine does.
    """
    eos = tokenizer_of(Path(tokenizer_dir)).eos_token_ids
    cfg = ModelConfig(architecture=architecture, vocab_size=vocab_rows, hidden_size=hidden,
                      intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, head_dim=hidden // heads, tie_word_embeddings=tie,
                      attention_bias=architecture == "Qwen2ForCausalLM",
                      qk_norm=architecture == "Qwen3ForCausalLM",
                      eos_token_id=eos if len(eos) != 1 else eos[0])
    torch.manual_seed(seed)
    model = CausalLM(cfg)
    state = model.state_dict()
    if architecture == "Qwen3ForCausalLM":  # random q/k norm weights, so the q/k norm path matters
        generator = torch.Generator().manual_seed(seed + 1)
        for name in state:
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                state[name] = 1 + 0.3 * torch.randn(state[name].shape, generator=generator)
    head = "model.embed_tokens.weight" if tie else "lm_head.weight"
    state[head] = state[head] * head_scale
    # Rows past the tokenizer (padding) are zero, as in real checkpoints: transformers does not mask them.
    state[head][tokenizer_of(Path(tokenizer_dir)).vocab_size:] = 0
    return write_checkpoint(directory, cfg, state, tokenizer_dir)


def read_checkpoint(directory: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    cfg = ModelConfig.from_file(Path(directory) / "config.json")
    state = load_file(str(Path(directory) / "model.safetensors"))
    if cfg.tie_word_embeddings and "lm_head.weight" not in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return cfg, state


def add_noise(state: dict[str, torch.Tensor], noise: float, seed: int) -> dict[str, torch.Tensor]:
    """Every tensor plus Gaussian noise of `noise` times its own standard deviation."""
    generator = torch.Generator().manual_seed(seed)
    out = {}
    for name, tensor in state.items():
        scale = tensor.float().std() if tensor.numel() > 1 and tensor.float().std() > 0 else tensor.abs().mean()
        out[name] = tensor + noise * scale * torch.randn(tensor.shape, generator=generator)
    return out


def noisy_copy(target_dir: Path, directory: Path, noise: float, seed: int) -> Path:
    """A draft that agrees with the target partly: the target's weights plus noise, same tokenizer."""
    cfg, state = read_checkpoint(target_dir)
    return write_checkpoint(directory, cfg, add_noise(state, noise, seed), target_dir)


def write_tokenizer_variant(tokenizer_dir: Path, directory: Path, shuffle_seed: int | None = None,
                            num_merges: int | None = None) -> Path:
    """A variant of a byte-level BPE tokenizer: its model-vocab ids shuffled and/or cut to the first
    num_merges merges. Added (special) tokens keep their content and, unless the vocabulary is cut, their ids.

    Cutting relies on the GPT-2 layout (ids 0..255 are the bytes, id 256+i is merge i's result), so the first
    256 + num_merges pieces and the first num_merges merges form a complete smaller tokenizer.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    copy_tokenizer(tokenizer_dir, directory)
    data = json.loads((Path(tokenizer_dir) / "tokenizer.json").read_text())
    model = data["model"]
    special = {a["content"] for a in data["added_tokens"]}
    pieces = sorted((i, p) for p, i in model["vocab"].items() if p not in special)   # (id, piece)
    if num_merges is not None:
        assert all(i == n for n, (i, _) in enumerate(pieces[:256 + num_merges])), "not a GPT-2 layout vocabulary"
        pieces, model["merges"] = pieces[:256 + num_merges], model["merges"][:num_merges]
        for offset, added in enumerate(data["added_tokens"]):
            added["id"] = len(pieces) + offset
    ids = torch.tensor([i for i, _ in pieces])
    if shuffle_seed is not None:
        ids = ids[torch.randperm(len(ids), generator=torch.Generator().manual_seed(shuffle_seed))]
    model["vocab"] = {p: int(i) for (_, p), i in zip(pieces, ids)}
    model["vocab"].update({a["content"]: a["id"] for a in data["added_tokens"]})
    (directory / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
    return directory


def _pieces(tokenizer_dir: Path) -> dict[str, int]:
    data = json.loads((Path(tokenizer_dir) / "tokenizer.json").read_text())
    return {**data["model"]["vocab"], **{a["content"]: a["id"] for a in data["added_tokens"]}}


def draft_on_tokenizer(target_dir: Path, directory: Path, draft_tokenizer_dir: Path, vocab_rows: int | None = None,
                       noise: float = 0.0, seed: int = 0) -> Path:
    """The target's weights moved onto another tokenizer: the embedding and head row of each draft token is
    the target's row of the same piece (random where the target has no such piece), then noise."""
    cfg, state = read_checkpoint(target_dir)
    target_pieces, draft_pieces = _pieces(target_dir), _pieces(draft_tokenizer_dir)
    vocab_rows = vocab_rows or max(draft_pieces.values()) + 1
    shared = [(d, target_pieces[p]) for p, d in draft_pieces.items() if p in target_pieces]
    draft_rows = torch.tensor([d for d, _ in shared])
    target_rows = torch.tensor([t for _, t in shared])
    generator = torch.Generator().manual_seed(seed)
    state = dict(state)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        rows = state[name]
        moved = rows.std() * torch.randn(vocab_rows, rows.shape[1], generator=generator)
        moved[draft_rows] = rows[target_rows]
        state[name] = moved
    if noise:
        state = add_noise(state, noise, seed + 1)
    draft_cfg = ModelConfig(**{**cfg.__dict__, "vocab_size": vocab_rows, "tie_word_embeddings": False,
                               "eos_token_id": tokenizer_of(Path(draft_tokenizer_dir)).eos_token_ids[0]})
    return write_checkpoint(directory, draft_cfg, state, draft_tokenizer_dir)


def shuffled_copy(target_dir: Path, directory: Path, seed: int, noise: float = 0.0) -> Path:
    """The target with its vocabulary shuffled: a shuffled tokenizer, embedding and head rows moved to match."""
    tokenizer_dir = write_tokenizer_variant(target_dir, Path(directory).with_name(Path(directory).name + "_tok"),
                                            shuffle_seed=seed)
    return draft_on_tokenizer(target_dir, directory, tokenizer_dir, noise=noise, seed=seed)


def gsm8k_questions(n: int, start: int = 0) -> list[str]:
    lines = GSM8K_TEST.read_text().splitlines()[start:start + n]
    return [json.loads(line)["question"] for line in lines]


# -- session fixtures -----------------------------------------------------------------------------------------
class Checkpoints:
    """Lazily built checkpoints under one session tmp dir (each built at most once)."""

    def __init__(self, root: Path):
        self.root = root
        self._built: dict[str, object] = {}

    def _get(self, name, build):
        if name not in self._built:
            self._built[name] = build(self.root / name)
        return self._built[name]

    # qwen3 / llama2 pair (TLI both ways): 151936 and 32000 rows
    @property
    def qwen3_target(self) -> Path:
        return self._get("qwen3_target", lambda d: make_checkpoint(
            d, "Qwen3ForCausalLM", TOKENIZERS / "qwen3", 151936, hidden=32, layers=2, heads=4, kv_heads=2, seed=11,
            head_scale=4.0))

    @property
    def llama2_draft(self) -> Path:
        return self._get("llama2_draft", lambda d: make_checkpoint(
            d, "LlamaForCausalLM", TOKENIZERS / "llama2", 32000, hidden=32, layers=1, heads=4, kv_heads=4, seed=12,
            head_scale=4.0))

    @property
    def llama2_target(self) -> Path:
        return self._get("llama2_target", lambda d: make_checkpoint(
            d, "LlamaForCausalLM", TOKENIZERS / "llama2", 32000, hidden=48, layers=2, heads=4, kv_heads=2, seed=13,
            head_scale=4.0))

    @property
    def qwen3_draft(self) -> Path:
        return self._get("qwen3_draft", lambda d: make_checkpoint(
            d, "Qwen3ForCausalLM", TOKENIZERS / "qwen3", 151936, hidden=32, layers=1, heads=4, kv_heads=4, seed=14,
            head_scale=4.0, tie=True))

    # smollm2 family (identity and d2t): 49152 rows
    @property
    def smollm2_target(self) -> Path:
        return self._get("smollm2_target", lambda d: make_checkpoint(
            d, "LlamaForCausalLM", TOKENIZERS / "smollm2", 49152, hidden=32, layers=2, heads=4, kv_heads=2, seed=21,
            head_scale=4.0, tie=True))

    @property
    def smollm2_random_draft(self) -> Path:
        return self._get("smollm2_random_draft", lambda d: make_checkpoint(
            d, "LlamaForCausalLM", TOKENIZERS / "smollm2", 49152, hidden=32, layers=1, heads=4, kv_heads=4, seed=22,
            head_scale=4.0))

    @property
    def smollm2_noisy_draft(self) -> Path:
        return self._get("smollm2_noisy_draft", lambda d: noisy_copy(self.smollm2_target, d, noise=0.5, seed=23))

    @property
    def smollm2_padded_draft(self) -> Path:
        """Same tokenizer, 128 more (padding) rows than the target, as Qwen2.5-0.5B (151936 rows) has for
        Qwen2.5-7B (152064)."""
        def build(d):
            cfg, state = read_checkpoint(self.smollm2_target)
            state = add_noise(state, 0.5, seed=25)
            for name in ("model.embed_tokens.weight", "lm_head.weight"):
                state[name] = torch.cat([state[name], torch.zeros(128, cfg.hidden_size)])
            padded_cfg = ModelConfig(**{**cfg.__dict__, "vocab_size": cfg.vocab_size + 128,
                                        "tie_word_embeddings": False})
            return write_checkpoint(d, padded_cfg, state, self.smollm2_target)
        return self._get("smollm2_padded_draft", build)

    @property
    def smollm2_d2t_draft(self) -> Path:
        return self._get("smollm2_d2t_draft", lambda d: make_d2t_draft(self.smollm2_target, d, num_head_rows=4096,
                                                                        noise=0.3, seed=24))

    # gpt2 family (TLI through a shuffled vocabulary; peaked, for sampling): 50257 rows
    @property
    def gpt2_target(self) -> Path:
        return self._get("gpt2_target", lambda d: make_checkpoint(
            d, "Qwen2ForCausalLM", TOKENIZERS / "gpt2", 50257, hidden=32, layers=1, heads=4, kv_heads=2, seed=31,
            head_scale=6.0))

    @property
    def gpt2_shuffled_draft(self) -> Path:
        return self._get("gpt2_shuffled_draft", lambda d: shuffled_copy(self.gpt2_target, d, seed=32))

    @property
    def gpt2_shuffled_noisy_draft(self) -> Path:
        return self._get("gpt2_shuffled_noisy_draft",
                         lambda d: shuffled_copy(self.gpt2_target, d, seed=33, noise=0.1))

    @property
    def gpt2_noisy_draft(self) -> Path:
        return self._get("gpt2_noisy_draft", lambda d: noisy_copy(self.gpt2_target, d, noise=0.1, seed=34))


    # small GPT-2 cut to 1024 merges (1281 tokens, 1296 rows: 15 padding rows): cheap sampling over the vocab
    @property
    def small_tokenizer(self) -> Path:
        return self._get("small_tokenizer", lambda d: write_tokenizer_variant(TOKENIZERS / "gpt2", d, num_merges=1024))

    @property
    def small_target(self) -> Path:
        return self._get("small_target", lambda d: make_checkpoint(
            d, "LlamaForCausalLM", self.small_tokenizer, 1296, hidden=32, layers=2, heads=4, kv_heads=2, seed=41,
            head_scale=SMALL_HEAD_SCALE))

    @property
    def small_noisy_draft(self) -> Path:
        return self._get("small_noisy_draft", lambda d: noisy_copy(self.small_target, d, noise=SMALL_NOISE, seed=42))

    @property
    def small_d2t_draft(self) -> Path:
        return self._get("small_d2t_draft", lambda d: make_d2t_draft(self.small_target, d, num_head_rows=640,
                                                                      noise=SMALL_NOISE, seed=45))

    @property
    def small_tli_draft(self) -> Path:
        """Another tokenizer: GPT-2 cut to 768 merges and shuffled, so 256 target tokens are outside the
        intersection (re-sync by bytes) and every shared token has another id."""
        def build(d):
            tokenizer_dir = write_tokenizer_variant(TOKENIZERS / "gpt2", self.root / "small_tli_tokenizer",
                                                    shuffle_seed=43, num_merges=768)
            return draft_on_tokenizer(self.small_target, d, tokenizer_dir, noise=SMALL_NOISE, seed=44)
        return self._get("small_tli_draft", build)


    @property
    def gpt2_eos_target(self) -> Path:
        """gpt2_target changed to end EOS_PROMPT's greedy continuation with EOS within 6 tokens."""
        return self._get("gpt2_eos_target", lambda d: eos_copy(self.gpt2_target, d, EOS_PROMPT, eos_by=6))


def make_d2t_draft(target_dir: Path, directory: Path, num_head_rows: int, noise: float, seed: int,
                   d2t_tensors: dict | None = None) -> Path:
    """A reduced-head draft (speculators convention): the target plus noise, its output head cut to the
    num_head_rows target tokens most frequent in GSM8K questions (EOS always kept); d2t / t2d in
    d2t.safetensors. The draft reads target ids (full embedding) and shares the target's tokenizer."""
    from anydraft.vocab.d2t import build_d2t_from_ids

    tokenizer = tokenizer_of(Path(target_dir))
    cfg, state = read_checkpoint(target_dir)
    corpus_target_ids = [t for q in gsm8k_questions(300) for t in tokenizer.encode(q, add_special_tokens=False)]
    d2t, t2d = build_d2t_from_ids(corpus_target_ids, num_head_rows, cfg.vocab_size,
                                  always_include=tokenizer.eos_token_ids)
    state = add_noise(state, noise, seed)
    state["lm_head.weight"] = state["lm_head.weight"][torch.arange(len(d2t)) + d2t].clone()
    state["model.embed_tokens.weight"] = state["model.embed_tokens.weight"].clone()
    draft_cfg = ModelConfig(**{**cfg.__dict__, "tie_word_embeddings": False})
    return write_checkpoint(directory, draft_cfg, state, target_dir, d2t_tensors or {"d2t": d2t, "t2d": t2d})


def eos_copy(target_dir: Path, directory: Path, prompt: str, eos_by: int) -> Path:
    """The target with EOS's head row set to 1.5x the row of its eos_by-th greedy token for `prompt`: EOS then
    outscores that token wherever it would win, so the greedy continuation ends with EOS by then."""
    cfg, state = read_checkpoint(target_dir)
    from reference_model import reference_greedy   # it imports this module
    continuation = reference_greedy(target_dir, prompt, eos_by)
    eos = tokenizer_of(Path(target_dir)).eos_token_ids[0]
    head = state["lm_head.weight"].clone()
    head[eos] = 1.5 * head[continuation[-1]]
    state["lm_head.weight"] = head
    draft_cfg = ModelConfig(**{**cfg.__dict__, "tie_word_embeddings": False})
    return write_checkpoint(directory, draft_cfg, state, target_dir)


class LLMCache:
    """One LLM per (target, draft, settings), shared by the session: loading qwen3's tokenizer and bridge
    costs seconds; generation state is per request, so sharing is safe."""

    def __init__(self):
        self._llms = {}

    def get(self, target: Path, draft: Path | None = None, k: int = 3, vocab_mode: str = "auto",
            max_num_seqs: int = 4, dtype: str = "float64", max_model_len: int = 256, **spec_options):
        from anydraft.llm import LLM
        key = (str(target), str(draft), k, vocab_mode, max_num_seqs, dtype, max_model_len,
               tuple(sorted(spec_options.items())))
        if key not in self._llms:
            # Fixed k unless a test asks for adaptive speculation: these tests check the k-token step itself.
            spec = None if draft is None else {"model": str(draft), "num_speculative_tokens": k,
                                               "vocab_mode": vocab_mode, "adaptive": False, **spec_options}
            self._llms[key] = LLM(model=str(target), speculative_config=spec, dtype=dtype, device="cpu",
                                  max_num_seqs=max_num_seqs, max_model_len=max_model_len)
        return self._llms[key]
