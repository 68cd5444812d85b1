"""The distillation loop: the target as teacher and the draft as student (transformers models, float32), AdamW on
the draft, the loss of objective.py at every shared boundary, resumable from the output directory."""
from __future__ import annotations

import json
import math
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..model.loader import resolve_model_path
from ..tokenizer import Tokenizer
from ..vocab.bridge import VocabBridge
from ..vocab.resync import DraftResync
from .examples import (Example, align, as_target_continuation, corpus_prompts, on_policy_prompts,
                       sample_continuations)
from .objective import LOSSES, acceptance, distillation_loss, proposal_log_probs, target_probs_on

STATE_FILE = "distill_state.pt"   # resumable state: examples, the draft's weights, the optimizer, the step
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


@dataclass(frozen=True)
class DistillConfig:
    target: str
    draft: str
    corpus: str
    out: str
    temperature: float = 0.7      # the serving temperature the draft is fitted to
    steps: int = 200              # optimizer steps
    loss: str = "tv"              # tv | kl | jsd (objective.py)
    batch_size: int = 8           # continuations per step
    num_prompts: int = 256        # corpus prompts the target continues for training
    held_out: int = 32            # further corpus prompts, never trained on, that 1 - TV is reported on
    max_tokens: int = 128         # tokens per continuation
    learning_rate: float = 3e-4
    seed: int = 0
    eval_every: int = 50          # steps between held-out evaluations
    on_policy: float = 0.0        # fraction of training prompts continued by the draft itself, scored by the target

    def __post_init__(self):
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 (distillation fits a sampled distribution), got "
                             f"{self.temperature}")
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {', '.join(LOSSES)}, got {self.loss!r}")
        for name in ("steps", "batch_size", "num_prompts", "held_out", "max_tokens", "eval_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.on_policy <= 1.0:
            raise ValueError(f"on_policy is a fraction of the training prompts, in [0, 1]; got {self.on_policy}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")


@dataclass
class Columns:
    """The intersection: draft ids the draft may propose and their target ids, in one order."""
    draft_ids: torch.Tensor    # [N]
    target_ids: torch.Tensor   # [N]


def intersection_columns(bridge: VocabBridge) -> Columns:
    if bridge.is_identity:
        ids = torch.nonzero(bridge.draft_in_intersection).flatten()
        return Columns(ids, ids)
    draft_ids = bridge.pruned_draft_rows()
    return Columns(draft_ids, bridge.draft_to_target[draft_ids])


def load_hf(path: Path):
    try:
        import transformers
    except ImportError as e:   # a clear message, not a traceback
        raise ValueError("anydraft distill trains with transformers: pip install 'anydraft[distill]'") from e
    return transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)


class Distiller:
    def __init__(self, cfg: DistillConfig):
        self.cfg = cfg
        self.target_path, self.draft_path = resolve_model_path(cfg.target), resolve_model_path(cfg.draft)
        self.out = Path(cfg.out)
        self.target_tokenizer = Tokenizer.from_dir(self.target_path)
        self.draft_tokenizer = Tokenizer.from_dir(self.draft_path)
        self.teacher = load_hf(self.target_path).eval()
        self.student = load_hf(self.draft_path)
        bridge = VocabBridge.build(self.target_tokenizer, self.draft_tokenizer,
                                   self.teacher.config.vocab_size, self.student.config.vocab_size)
        self.columns = intersection_columns(bridge)
        self.resync = DraftResync(bridge, self.target_tokenizer, self.draft_tokenizer)
        self.num_token_rows = min(self.target_tokenizer.vocab_size, self.teacher.config.vocab_size)
        # Rows of the draft's embedding that are exactly zero (tokens its training never saw) stay zero: the
        # checkpoint keeps its size, and a token the draft never read is not learned from a few boundaries.
        embedding = self.student.get_input_embeddings().weight
        self.trainable_rows = (embedding.detach().abs().sum(dim=1) > 0).float()[:, None]   # [V_draft_rows, 1]
        embedding.register_hook(lambda grad: grad * self.trainable_rows)
        self.optimizer = torch.optim.AdamW(self.student.parameters(), lr=cfg.learning_rate, weight_decay=0.0)
        self.step = 0
        self.history: list[dict] = []
        self.train: list[Example] = []
        self.held_out: list[Example] = []

    # -- data ------------------------------------------------------------------------------------------------
    def prepare(self, progress=None) -> None:
        """Sample continuations of the training and held-out prompts and align them (once: resumed runs read them
        back). The target writes them, but for the on_policy fraction of training prompts, which the draft writes
        (the contexts its own proposals create); held-out text is always the target's, as while serving."""
        cfg = self.cfg
        prompts = corpus_prompts(cfg.corpus)
        needed = cfg.num_prompts + cfg.held_out
        if len(prompts) < needed:
            raise ValueError(f"corpus {cfg.corpus} has {len(prompts)} prompts; --num-prompts {cfg.num_prompts} and "
                             f"--held-out {cfg.held_out} need {needed}")
        chosen = prompts[:cfg.num_prompts] + prompts[-cfg.held_out:]   # held-out from the far end of the corpus
        seeds = [cfg.seed + i for i in range(len(chosen))]
        drafted = on_policy_prompts(cfg.num_prompts, cfg.on_policy)
        kept = sorted(set(range(cfg.num_prompts)) - set(drafted))
        held_out = list(range(cfg.num_prompts, len(chosen)))
        groups = [(cfg.target, [kept, held_out]), (cfg.draft, [drafted])]   # held-out alone: the same for any on_policy
        continuations: list[list[int]] = [[] for _ in chosen]
        for model, index_groups in groups:
            if not any(index_groups):
                continue
            calls = [([chosen[i] for i in indices], [seeds[i] for i in indices]) for indices in index_groups]
            sampled = sample_continuations(model, calls, cfg.temperature, cfg.max_tokens, batch_size=64,
                                           progress=progress)
            for indices, group in zip(index_groups, sampled):
                for i, ids in zip(indices, group):
                    continuations[i] = ids
        prompt_ids = [self.target_tokenizer.encode(p) for p in chosen]
        for i in drafted:   # the draft's text as the target reads it
            text = self.draft_tokenizer.decode(continuations[i], skip_special_tokens=False)
            continuations[i] = as_target_continuation(self.target_tokenizer, chosen[i], prompt_ids[i], text)
        examples = [align(self.resync, ids, p, c) for p, ids, c in zip(chosen, prompt_ids, continuations)]
        # Split by prompt before dropping examples with no shared boundary, so no training prompt becomes held-out.
        self.train = [e for e in examples[:cfg.num_prompts] if e.target_positions]
        self.held_out = [e for e in examples[cfg.num_prompts:] if e.target_positions]

    # -- the objective on one example ----------------------------------------------------------------------
    def target_probs_at(self, example: Example) -> torch.Tensor:   # [M, N]
        with torch.no_grad():
            hidden = self.teacher.model(torch.tensor([example.target_ids])).last_hidden_state[0]   # [L, hidden]
            logits = self.teacher.lm_head(hidden[example.target_positions])                       # [M, V_target]
            return target_probs_on(logits, self.columns.target_ids, self.cfg.temperature, self.num_token_rows)

    def proposal_log_probs_at(self, example: Example) -> torch.Tensor:   # [M, N]
        hidden = self.student.model(torch.tensor([example.draft_ids])).last_hidden_state[0]
        logits = self.student.lm_head(hidden[example.draft_positions])[:, self.columns.draft_ids]
        return proposal_log_probs(logits, self.cfg.temperature)

    def evaluate(self, examples: list[Example]) -> float:
        """Mean acceptance (1 - TV) over every shared boundary of the examples."""
        total, count = 0.0, 0
        with torch.no_grad():
            for example in examples:
                accepted = acceptance(self.target_probs_at(example), self.proposal_log_probs_at(example))
                total, count = total + accepted.sum().item(), count + len(accepted)
        return total / max(count, 1)

    # -- training --------------------------------------------------------------------------------------------
    def train_steps(self, on_step=None) -> None:
        cfg = self.cfg
        order = random.Random(cfg.seed)
        for _ in range(self.step):   # resumed: the batches' order where it was
            order.sample(range(len(self.train)), min(cfg.batch_size, len(self.train)))
        self.student.train()
        while self.step < cfg.steps:
            batch = [self.train[i] for i in order.sample(range(len(self.train)), min(cfg.batch_size, len(self.train)))]
            positions = sum(len(e.target_positions) for e in batch)
            for group in self.optimizer.param_groups:   # cosine from the full rate to 0 over the steps
                group["lr"] = cfg.learning_rate * 0.5 * (1 + math.cos(math.pi * self.step / cfg.steps))
            self.optimizer.zero_grad()
            loss_total = 0.0
            for example in batch:   # each weighted by its positions: the mean over the batch's boundaries
                loss = distillation_loss(self.target_probs_at(example), self.proposal_log_probs_at(example), cfg.loss)
                (loss * len(example.target_positions) / positions).backward()
                loss_total += loss.item() * len(example.target_positions) / positions
            torch.nn.utils.clip_grad_norm_(self.student.parameters(), 1.0)
            self.optimizer.step()
            self.step += 1
            record = {"step": self.step, "loss": loss_total}
            self.history.append(record)
            if self.step % cfg.eval_every == 0 or self.step == cfg.steps:
                self.student.eval()
                record["held_out_acceptance"] = self.evaluate(self.held_out)
                self.student.train()
                self.save_state()
            if on_step is not None:
                on_step(record)
        self.student.eval()

    # -- files -----------------------------------------------------------------------------------------------
    def save_state(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        torch.save({"config": asdict(self.cfg), "step": self.step, "history": self.history,
                    "student": self.student.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "train": [asdict(e) for e in self.train], "held_out": [asdict(e) for e in self.held_out]},
                   self.out / STATE_FILE)

    def load_state(self) -> bool:
        """Resume from the output directory's state; False where there is none. A state written for other
        settings (target, draft, corpus, temperature, loss) is refused."""
        path = self.out / STATE_FILE
        if not path.exists():
            return False
        state = torch.load(path, weights_only=False)
        saved = {"on_policy": 0.0, **state["config"]}   # states written before on_policy existed
        for key in ("target", "draft", "corpus", "temperature", "loss", "num_prompts", "held_out", "max_tokens", "seed",
                    "on_policy"):
            if saved[key] != getattr(self.cfg, key):
                raise ValueError(f"{path} was written with {key}={saved[key]!r}, not {getattr(self.cfg, key)!r}: "
                                 f"use another --out, or the same settings to resume")
        self.student.load_state_dict(state["student"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.history = state["step"], state["history"]
        self.train = [Example(**e) for e in state["train"]]
        self.held_out = [Example(**e) for e in state["held_out"]]
        return True

    def write_checkpoint(self) -> None:
        """A standard HF checkpoint of the draft in the starting checkpoint's dtype (trained in float32) and its
        tokenizer files."""
        raw = json.loads((self.draft_path / "config.json").read_text())
        dtype = getattr(torch, str(raw.get("dtype") or raw.get("torch_dtype") or "bfloat16"))
        self.student.to(dtype)
        self.student.save_pretrained(str(self.out), safe_serialization=True)
        self.student.float()
        for name in TOKENIZER_FILES:
            if (self.draft_path / name).exists():
                shutil.copy(self.draft_path / name, self.out / name)

    def write_summary(self, summary: dict) -> None:
        (self.out / "distill.json").write_text(json.dumps(summary, indent=1))
