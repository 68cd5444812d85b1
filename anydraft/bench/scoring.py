"""What the bench's outputs say beyond speed: GSM8K accuracy, exact matches against the target alone (per prompt,
whatever the batch size), and acceptance on the texts two systems decoded alike."""
from __future__ import annotations

from ..eval import gsm8k
from .contenders import acceptance_length


def strip_eos(ids: list[int], eos_ids: set[int]) -> list[int]:
    return ids[:-1] if ids and ids[-1] in eos_ids else ids


def score_outputs(run: dict, tokenizer, golds: list[str], reference: list[list[int]] | None) -> None:
    """GSM8K accuracy of the run's completions; exact token matches against the target alone, prompt by prompt."""
    outputs = run.pop("output_target_ids", None)
    if not outputs:
        return
    eos = set(tokenizer.eos_token_ids)
    outputs = [strip_eos(o, eos) for o in outputs]
    texts = [tokenizer.decode(o) for o in outputs]
    for stop in gsm8k.STOP_STRINGS:
        texts = [t.split(stop)[0] for t in texts]
    run["gsm8k_accuracy"] = sum(gsm8k.extract_answer(t) == g for t, g in zip(texts, golds)) / len(golds)
    if reference is not None:
        run["exact_matches_vs_target_alone"] = sum(o == r for o, r in zip(outputs, reference))
    run["_outputs"] = outputs


def acceptance_on_identical_texts(ours: dict, peer: dict, batch_size: int = 1) -> dict:
    """AL of anydraft TLI and a peer over the groups (of batch_size prompts) in which both decoded the very same
    tokens for every prompt: bf16 kernels differ between systems, and different texts accept differently, so
    this is the like-for-like AL. Step counts are per group (a peer reports one count per llm.generate call)."""
    def group_outputs(run: dict) -> list[list[list[int]]]:
        outputs = run["_outputs"]
        return [outputs[i:i + batch_size] for i in range(0, len(outputs), batch_size)]

    same = [g for g, (a, b) in enumerate(zip(group_outputs(ours), group_outputs(peer))) if a == b]

    def acceptance(run: dict) -> float | None:
        steps = [run["per_group_steps"][g] for g in same]
        accepted = None if any(a is None for _, a in steps) else sum(a for _, a in steps)
        tokens = sum(len(o) for g in same for o in group_outputs(run)[g])
        return acceptance_length(tokens, sum(f for f, _ in steps), accepted)

    return {"num_prompts": sum(len(group_outputs(ours)[g]) for g in same), "anydraft": acceptance(ours),
            "peer": acceptance(peer)}
