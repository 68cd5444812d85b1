"""Tiny speculators-format drafters (EAGLE-3, DSpark) for the tiny random targets of tiny_models.py."""
from __future__ import annotations

from pathlib import Path

import torch

from anydraft.model.config import ModelConfig
from anydraft.model.eagle3 import Eagle3Draft
from anydraft.checkpoints.speculators_writer import write_speculators_checkpoint
from anydraft.vocab.d2t import build_d2t_from_ids

from tiny_models import gsm8k_questions, read_checkpoint, tokenizer_of


def aux_layers(target_cfg: ModelConfig) -> list[int]:
    """Speculators' default pick (2, L/2, L-3) needs L >= 5; tiny targets take the embeddings, middle, last."""
    n = target_cfg.num_hidden_layers
    return [0, n // 2, n]


def frequent_d2t(target_dir: Path, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft_vocab_size target tokens most frequent in GSM8K questions (EOS kept), as speculators builds it."""
    tokenizer = tokenizer_of(Path(target_dir))
    cfg, _ = read_checkpoint(target_dir)
    corpus = [t for q in gsm8k_questions(300) for t in tokenizer.encode(q, add_special_tokens=False)]
    return build_d2t_from_ids(corpus, draft_vocab_size, cfg.vocab_size, always_include=tokenizer.eos_token_ids)


def make_eagle3_draft(target_dir: Path, directory: Path, draft_vocab_size: int | None, seed: int,
                      head_scale: float = 1.0, share_head: bool = False, state_override: dict | None = None,
                      d2t_tables: tuple | None = None) -> Path:
    """A random EAGLE-3 drafter for target_dir: hidden as the target's, one layer, embedding shared with the
    target (left out of the checkpoint). draft_vocab_size None: the full vocabulary; share_head then leaves the
    head out too (the target's). Else a reduced head over the most frequent tokens, with d2t / t2d."""
    target_cfg, target_state = read_checkpoint(target_dir)
    layer_cfg = ModelConfig(**{**target_cfg.__dict__, "num_hidden_layers": 1, "tie_word_embeddings": False})
    aux = aux_layers(target_cfg)
    torch.manual_seed(seed)
    head_rows = target_cfg.vocab_size if draft_vocab_size is None else draft_vocab_size
    module = Eagle3Draft(layer_cfg, len(aux), target_cfg.hidden_size, head_rows)
    state = {k: v for k, v in module.state_dict().items() if k != "embed_tokens.weight"}
    if layer_cfg.qk_norm:
        generator = torch.Generator().manual_seed(seed + 1)
        for name in state:
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                state[name] = 1 + 0.3 * torch.randn(state[name].shape, generator=generator)
    if draft_vocab_size is not None:
        d2t, t2d = d2t_tables or frequent_d2t(target_dir, draft_vocab_size)
        state["lm_head.weight"] = target_state["lm_head.weight"][torch.arange(draft_vocab_size) + d2t].clone()
        state["d2t"], state["t2d"] = d2t, t2d
    elif share_head:
        del state["lm_head.weight"]
    else:
        state["lm_head.weight"] = target_state["lm_head.weight"].clone()
    if "lm_head.weight" in state:
        state["lm_head.weight"] = state["lm_head.weight"] * head_scale
    state.update(state_override or {})
    return write_speculators_checkpoint(directory, "eagle3", layer_cfg, head_rows, aux, 3, str(target_dir),
                                        [target_cfg.architecture], state)


def target_continuations(target_dir: Path, num_prompts: int = 120, max_tokens: int = 48) -> list[list[int]]:
    """GSM8K test questions (from 200 on: not the prompts the tests decode) with the target's greedy
    continuation: the text a drafter sees at inference."""
    from anydraft.config import SamplingParams
    from anydraft.llm import LLM
    alone = LLM(model=str(target_dir), dtype="float32", device="cpu", max_num_seqs=32, max_model_len=256)
    outputs = alone.generate(gsm8k_questions(num_prompts, start=200), SamplingParams(temperature=0, max_tokens=max_tokens))
    return [o.prompt_token_ids + o.outputs[0].token_ids for o in outputs]


def sampled_continuations(target_dir: Path, prompt: str, num: int = 768, max_tokens: int = 8) -> list[list[int]]:
    """`prompt` with num continuations sampled from the target at temperature 1 (seeded)."""
    from anydraft.config import SamplingParams
    from anydraft.llm import LLM
    alone = LLM(model=str(target_dir), dtype="float32", device="cpu", max_num_seqs=64, max_model_len=64)
    params = [SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=123_000 + i) for i in range(num)]
    return [o.prompt_token_ids + o.outputs[0].token_ids for o in alone.generate([prompt] * num, params)]


def trained_eagle3_draft(target_dir: Path, directory: Path, draft_vocab_size: int | None, steps: int = 60,
                         seed: int = 0, sampled_prompt: str | None = None,
                         layer_architecture: str = "LlamaForCausalLM") -> Path:
    """An EAGLE-3 drafter trained briefly by train/train_eagle3.py (the shipped drafters' code) on the target's
    own greedy continuations (and, with sampled_prompt, on samples after that prompt): it agrees with the
    target often enough that both acceptance and rejection run."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "train"))
    from train_eagle3 import train_eagle3
    sequences = target_continuations(target_dir)
    if sampled_prompt is not None:
        sequences += sampled_continuations(target_dir, sampled_prompt)
    train_eagle3(target_dir, directory, draft_vocab_size, steps=steps, tokens_per_batch=512, lr=2e-2, seed=seed,
                 log_every=0, sequences=sequences, layer_architecture=layer_architecture)
    return directory


def trained_dspark_draft(target_dir: Path, directory: Path, draft_vocab_size: int | None, anchor_first: bool,
                         steps: int = 60, seed: int = 0, sampled_prompt: str | None = None) -> Path:
    """A DSpark drafter (block 4, Markov rank 32) trained briefly by train/train_dspark.py on the target's own
    continuations (and, with sampled_prompt, on samples after that prompt), in either block layout."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "train"))
    from train_dspark import train_dspark
    sequences = target_continuations(target_dir)
    if sampled_prompt is not None:
        sequences += sampled_continuations(target_dir, sampled_prompt)
    train_dspark(target_dir, directory, draft_vocab_size, steps=steps, tokens_per_batch=512, lr=2e-2,
                 anchor_first=anchor_first, sequences=sequences, seed=seed, log_every=0)
    return directory


class HiddenStateCheckpoints:
    """Drafters for tiny targets, built once per session (see tiny_models.Checkpoints)."""

    def __init__(self, ckpts):
        self.ckpts = ckpts

    def _get(self, name, build):
        return self.ckpts._get(name, build)

    @property
    def small_qwen3_target(self) -> Path:
        """Qwen3 (q/k norm) on the small GPT-2 vocabulary: the EAGLE-3 layer then has q/k norms too."""
        from tiny_models import make_checkpoint
        return self._get("small_qwen3_target", lambda d: make_checkpoint(
            d, "Qwen3ForCausalLM", self.ckpts.small_tokenizer, 1296, hidden=32, layers=3, heads=4, kv_heads=2,
            seed=51, head_scale=4.0))

    @property
    def small_eagle3_reduced(self) -> Path:
        return self._get("small_eagle3_reduced", lambda d: trained_eagle3_draft(self.ckpts.small_target, d, 640))

    @property
    def small_eagle3_full(self) -> Path:
        return self._get("small_eagle3_full", lambda d: trained_eagle3_draft(self.ckpts.small_target, d, None))

    @property
    def small_eagle3_sampling(self) -> Path:
        """Also trained on the target's samples after the sampling tests' prompt: acceptance under sampling."""
        from test_sampling_distribution import PROMPT
        return self._get("small_eagle3_sampling", lambda d: trained_eagle3_draft(
            self.ckpts.small_target, d, 640, steps=120, sampled_prompt=PROMPT))

    @property
    def small_dspark_anchor_first(self) -> Path:
        return self._get("small_dspark_anchor_first", lambda d: trained_dspark_draft(
            self.ckpts.small_target, d, 640, anchor_first=True))

    @property
    def small_dspark_sampling(self) -> Path:
        """Anchor-first, reduced head (640 rows), also trained on the target's samples after the sampling tests'
        prompt: acceptance under sampling."""
        from test_sampling_distribution import PROMPT
        return self._get("small_dspark_sampling", lambda d: trained_dspark_draft(
            self.ckpts.small_target, d, 640, anchor_first=True, steps=120, sampled_prompt=PROMPT))

    @property
    def small_dspark_fill_in(self) -> Path:
        """The 1+N layout: the anchor is the bonus token, slots 1..3 draft."""
        return self._get("small_dspark_fill_in", lambda d: trained_dspark_draft(
            self.ckpts.small_target, d, None, anchor_first=False))

    @property
    def qwen3_eagle3_reduced(self) -> Path:
        return self._get("qwen3_eagle3_reduced", lambda d: trained_eagle3_draft(
            self.small_qwen3_target, d, 512, layer_architecture="Qwen3ForCausalLM"))
