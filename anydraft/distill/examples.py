"""Distillation examples: sampled continuations of corpus prompts (the target's own, and optionally the draft's,
re-read by the target: on-policy), and the positions where the draft, reading that text as it does while serving
(its prompt encoding, then re-sync), stands at the same text boundary as the target, so its proposal there
competes with the target's next token."""
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


def sample_continuations(model: str, groups: list[tuple[list[str], list[int]]], temperature: float,
                         max_tokens: int, batch_size: int, progress=None) -> list[list[list[int]]]:
    """A model alone's sampled continuations (its own ids, specials at the end dropped) of each group of (prompts,
    seeds), prompt i seeded seeds[i]: the text it writes when it serves at this temperature (the target's, or the
    draft's for on-policy examples). Each group is its own generate call: where kernels are not batch invariant,
    a group's text then does not depend on what else was sampled."""
    from ..config import SamplingParams
    from ..llm import LLM
    llm = LLM(model, None, max_num_seqs=batch_size)
    specials = set(llm.tokenizer.special_ids)
    sampled = []
    for prompts, seeds in groups:
        params = [SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed) for seed in seeds]
        continuations = []
        for output in llm.generate(prompts, params, progress=progress) if prompts else []:
            ids = list(output.outputs[0].token_ids)
            while ids and ids[-1] in specials:
                ids.pop()
            continuations.append(ids)
        sampled.append(continuations)
    return sampled


def on_policy_prompts(num_prompts: int, fraction: float) -> list[int]:
    """Indices of the training prompts the draft continues: `fraction` of them, spread evenly over the corpus."""
    return [i for i in range(num_prompts) if int((i + 1) * fraction) > int(i * fraction)]


def as_target_continuation(target_tokenizer, prompt: str, prompt_target_ids: list[int], text: str) -> list[int]:
    """The target ids that continue prompt_target_ids with `text` (another model's writing): the target's encoding
    of prompt + text past the prompt, where the prompt's encoding is a prefix of it, else the text's on its own."""
    whole = target_tokenizer.encode(prompt + text)
    if whole[:len(prompt_target_ids)] == prompt_target_ids:
        return whole[len(prompt_target_ids):]
    return target_tokenizer.encode_fragment(text)


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
