"""Distillation examples: the target's own sampled continuations of corpus prompts, and the positions where the
draft, reading that text as it does while serving (its prompt encoding, then re-sync), stands at the same text
boundary as the target, so its proposal there competes with the target's next token."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..vocab.resync import DraftResync


@dataclass
class Example:
    target_ids: list[int]         # prompt + continuation, as the target read them
    draft_ids: list[int]          # the same text as the draft reads it while serving
    target_positions: list[int]   # positions whose target logits predict a token at a shared boundary
    draft_positions: list[int]    # the draft's positions predicting the token at the same boundary


def corpus_prompts(path: str | Path) -> list[str]:
    """Prompts of a corpus: .jsonl lines with `question` (GSM8K, formatted as the eval formats it), `prompt` or
    `text`; any other file: paragraphs separated by blank lines."""
    from ..eval import gsm8k
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus {path} does not exist")
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".jsonl":
        return [p.strip() for p in text.split("\n\n") if p.strip()]
    prompts = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        record = json.loads(line)
        if "question" in record:
            prompts.append(gsm8k.build_prompt(record["question"], [], None, False))
        elif isinstance(record.get("prompt") or record.get("text"), str):
            prompts.append(record.get("prompt") or record["text"])
        else:
            raise ValueError(f"{path}:{number}: a line needs a 'question', 'prompt' or 'text' string")
    return prompts


def sample_continuations(target: str, prompts: list[str], temperature: float, max_tokens: int, seed: int,
                         batch_size: int, progress=None) -> list[list[int]]:
    """The target alone's sampled continuations (target ids, specials at the end dropped), prompt i seeded seed + i:
    the text the target writes when it serves at this temperature."""
    from ..config import SamplingParams
    from ..llm import LLM
    llm = LLM(target, None, max_num_seqs=batch_size)
    specials = set(llm.tokenizer.special_ids)
    params = [SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed + i) for i in range(len(prompts))]
    outputs = llm.generate(prompts, params, progress=progress)
    continuations = []
    for output in outputs:
        ids = list(output.outputs[0].token_ids)
        while ids and ids[-1] in specials:
            ids.pop()
        continuations.append(ids)
    return continuations


def align(resync: DraftResync, prompt_target_ids: list[int], prompt: str, continuation: list[int]) -> Example:
    """The example for one continuation: the draft's ids as re-sync builds them while serving, and the positions
    where no target bytes are pending for the draft (its tokens spell exactly the target's text so far). A position
    whose draft prefix a later re-tokenization rewrote is left out (the draft never saw that prefix whole)."""
    state = resync.new_state(prompt)
    marks: list[tuple[int, int]] = []   # (target position, draft prefix length)
    if continuation and not state.pending:
        marks.append((len(prompt_target_ids) - 1, len(state.draft_ids)))
    for i, target_id in enumerate(continuation[:-1]):
        before = len(state.draft_ids)
        edit = resync.extend(state, [target_id])
        keep = before - edit.num_dropped
        while marks and marks[-1][1] > keep:
            marks.pop()
        if not state.pending:
            marks.append((len(prompt_target_ids) + i, len(state.draft_ids)))
    marks = [(t, n) for t, n in marks if n >= 1]
    return Example(prompt_target_ids + continuation, list(state.draft_ids),
                   [t for t, _ in marks], [n - 1 for _, n in marks])
