"""SLEM (vocab_mode "slem"): greedy output equals the target alone, token for token (float64), for every ordered
pair of the five shared tokenizers, on prompts with space runs, tabs, newlines, emoji and CJK.

Each draft is its target's weights moved onto the other tokenizer through tokens spelling the same bytes (noise
added), so it writes much of the target's text in its own tokens: steps accept some proposals and reject others.
The reference is the no-cache decoder (reference_model.reference_greedy). Proposals are ragged: a row proposes as many
target tokens as its text spells (0..k), which the verifier, cache rewind and statistics must respect.
"""
from __future__ import annotations

import pytest
import torch

from anydraft.config import SamplingParams
from anydraft.model.config import ModelConfig

from reference_model import reference_greedy
from tiny_models import TOKENIZERS, add_noise, make_checkpoint, read_checkpoint, tokenizer_of, \
    write_checkpoint

NAMES = ("qwen3", "smollm2", "llama2", "mistral_v0.1", "gpt2")
PAIRS = [(t, d) for t in NAMES for d in NAMES if t != d]
K = 4
ADVERSARIAL_PROMPTS = [
    "Tom has 3 apples.\n\nHe buys   12 more\t\tand eats 2. 🎉 How many?",
    "日本語のテキスト 你好, world!  \n\t x = 1234;  👍🏽 don't stop",
]


def _target(root, name):
    rows = tokenizer_of(TOKENIZERS / name).vocab_size
    return make_checkpoint(root / f"slem_target_{name}", "LlamaForCausalLM", TOKENIZERS / name, rows, hidden=16,
                           layers=1, heads=2, kv_heads=1, seed=100 + NAMES.index(name), head_scale=4.0)


def _draft_by_bytes(target_dir, directory, draft_tokenizer_dir, noise: float, seed: int):
    """The target's embedding and head rows moved to the draft tokens spelling the same bytes (random elsewhere)."""
    cfg, state = read_checkpoint(target_dir)
    target_table = tokenizer_of(target_dir).token_table
    draft_tokenizer = tokenizer_of(draft_tokenizer_dir)
    pairs = [(d, target_table.canonical_ids[b]) for d, b in enumerate(draft_tokenizer.token_table.token_bytes)
             if b and b in target_table.canonical_ids]
    draft_rows, target_rows = torch.tensor([d for d, _ in pairs]), torch.tensor([t for _, t in pairs])
    generator = torch.Generator().manual_seed(seed)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        moved = state[name].std() * torch.randn(draft_tokenizer.vocab_size, cfg.hidden_size, generator=generator)
        moved[draft_rows] = state[name][target_rows]
        state[name] = moved
    draft_cfg = ModelConfig(**{**cfg.__dict__, "vocab_size": draft_tokenizer.vocab_size, "tie_word_embeddings": False,
                               "eos_token_id": draft_tokenizer.eos_token_ids[0]})
    return write_checkpoint(directory, draft_cfg, add_noise(state, noise, seed + 1), draft_tokenizer_dir)


@pytest.fixture(scope="module")
def slem_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("slem")
    built = {}

    def get(target: str, draft: str | None = None):
        key = (target, draft)
        if key not in built:
            if draft is None:
                built[key] = _target(root, target)
            else:
                built[key] = _draft_by_bytes(get(target), root / f"slem_draft_{target}_{draft}", TOKENIZERS / draft,
                                             noise=0.05, seed=7)
        return built[key]

    return get


@pytest.mark.parametrize("target, draft", PAIRS, ids=[f"{t}-target_{d}-draft" for t, d in PAIRS])
def test_greedy_slem_matches_target_alone(slem_models, llms, prompts, target, draft):
    target_dir, draft_dir = slem_models(target), slem_models(target, draft)
    llm = llms.get(target_dir, draft_dir, k=K, vocab_mode="slem", max_num_seqs=3)
    assert llm.draft_info["vocab_mode"] == "slem"
    batch = ADVERSARIAL_PROMPTS + [prompts[2]]
    max_tokens = [14, 10, 12]
    before = dict(llm.stats.k_histogram)
    outputs = llm.generate(batch, [SamplingParams(temperature=0, max_tokens=n) for n in max_tokens])
    for prompt, n, out in zip(batch, max_tokens, outputs):
        assert out.outputs[0].token_ids == reference_greedy(target_dir, prompt, n), f"prompt {prompt[:30]!r}"
    histogram = {k: n - before.get(k, 0) for k, n in llm.stats.k_histogram.items()}
    assert set(histogram) <= set(range(K + 1)) and sum(histogram.values()) > 0
    accepted = sum(o.metrics["num_accepted"] for o in outputs)
    assert accepted <= sum(o.metrics["num_drafted"] for o in outputs)
    print(f"\n[{target} <- {draft}] drafted per row-step {dict(sorted(histogram.items()))}, accepted {accepted}")


def test_rows_proposing_different_counts_match_target_alone(slem_models, llms, prompts, monkeypatch):
    """One batch whose rows propose different counts in the same step, 0 included; the draft proposes what it
    would from scratch on its re-synced sequence (its cache kept and rewound right) and that sequence spells the
    target's text."""
    target_dir, draft_dir = slem_models("qwen3"), slem_models("qwen3", "smollm2")
    llm = llms.get(target_dir, draft_dir, k=K, vocab_mode="slem", max_num_seqs=4)
    proposer = llm.proposer
    runner, resync = proposer.writer.runner, proposer.resync
    real_propose = proposer.propose
    steps = []

    @torch.inference_mode()
    def from_scratch(row):
        draft_ids, out = list(proposer.writer.states[row].draft_ids), []
        for _ in range(K + 1):   # SLEM's draft writes k + 1 tokens (the last target token is held back)
            draft_id = int(runner.logits(runner.model(torch.tensor([draft_ids]))[:, -1]).argmax(-1))
            out.append(draft_id)
            draft_ids.append(draft_id)
        return out

    def propose(rows, sampling, num_tokens=None, target_states=None):
        expected = {row: from_scratch(row) for row in rows}
        proposal = real_propose(rows, sampling, num_tokens, target_states)
        for row in rows:
            assert proposer.written[row] == expected[row], f"row {row}: the draft's cache is out of step"
        steps.append(list(proposal.num_draft_tokens))
        return proposal

    real_add, real_observe = proposer.add_request, proposer.observe
    spelled = {}   # row -> (the draft's prompt bytes, the target's text bytes since)
    window = proposer.window

    def add_request(row, prompt_text, prompt_target_ids):
        real_add(row, prompt_text, prompt_target_ids)
        spelled[row] = [resync.draft_text_bytes(proposer.writer.states[row].draft_ids), b""]

    def observe(rows, num_accepted, new_target_ids):
        real_observe(rows, num_accepted, new_target_ids)
        for row, target_ids in zip(rows, new_target_ids):
            spelled[row][1] += b"".join(window.token_bytes(t) for t in target_ids if not window.is_special(t))
            state = proposer.writer.states[row]
            assert resync.draft_text_bytes(state.draft_ids) + state.pending == spelled[row][0] + spelled[row][1]
            checked.append(row)

    checked = []
    monkeypatch.setattr(proposer, "propose", propose)
    monkeypatch.setattr(proposer, "add_request", add_request)
    monkeypatch.setattr(proposer, "observe", observe)
    batch = ADVERSARIAL_PROMPTS + [prompts[2], prompts[5]]
    max_tokens = [24, 18, 20, 9]
    outputs = llm.generate(batch, [SamplingParams(temperature=0, max_tokens=n) for n in max_tokens])
    for prompt, n, out in zip(batch, max_tokens, outputs):
        assert out.outputs[0].token_ids == reference_greedy(target_dir, prompt, n), f"prompt {prompt[:30]!r}"
    assert len(checked) >= sum(max_tokens) // 2
    assert any(0 in counts and max(counts) > 0 for counts in steps), steps
    assert any(len(set(c for c in counts if c)) > 1 for counts in steps), steps
    accepted = sum(o.metrics["num_accepted"] for o in outputs)
    assert 0 < accepted < sum(o.metrics["num_drafted"] for o in outputs)
    histogram = llm.stats.k_histogram
    assert histogram.get(0, 0) > 0 and any(0 < k < K for k in histogram)


def test_sampling_is_refused_with_slem(slem_models, llms):
    llm = llms.get(slem_models("gpt2"), slem_models("gpt2", "llama2"), k=K, vocab_mode="slem")
    with pytest.raises(ValueError, match="temperature=0"):
        llm.generate(["Hello"], SamplingParams(temperature=0.7, max_tokens=4))
    [out] = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=4))
    assert len(out.outputs[0].token_ids) == 4


def test_slem_reports_its_draft_runner_like_every_draft(slem_models, llms):
    """eval, advise and `generate --json` read proposer.runner (kernels, costs): SLEM's is its writer's draft."""
    llm = llms.get(slem_models("gpt2"), slem_models("gpt2", "llama2"), k=K, vocab_mode="slem")
    assert llm.proposer.runner is llm.proposer.writer.runner
    assert set(llm.kernels) == {"target", "draft"}


HEAD_ROWS = 2048   # of qwen3's 151669 tokens: cut hard, so the whole head's favourite is often not writable


def test_frequency_ranked_head_matches_target_alone(slem_models, llms, prompts, draft_vocab_corpus, monkeypatch):
    """A SLEM draft whose head keeps only the draft ids its own tokenization of a corpus uses most writes only
    those ids (its EOS among them), proposes other text than the whole head would, and the output stays the
    target's."""
    target_dir, draft_dir = slem_models("mistral_v0.1"), slem_models("mistral_v0.1", "qwen3")
    whole = llms.get(target_dir, draft_dir, k=K, vocab_mode="slem")
    cut = llms.get(target_dir, draft_dir, k=K, vocab_mode="slem", draft_vocab_size=HEAD_ROWS,
                   draft_vocab_corpus=str(draft_vocab_corpus))
    info = cut.draft_info
    assert info["draft_head_rows"] == HEAD_ROWS == info["draft_vocab"]["size"] == cut.proposer.runner.head_rows
    assert 0 < info["draft_vocab"]["corpus_coverage_pct"] < 100 and info["draft_head_macs_saved_pct"] > 98
    kept = set(cut.proposer.writer.vocab.head_to_target.tolist())
    assert set(tokenizer_of(draft_dir).eos_token_ids) <= kept
    written = {"whole": [], "cut": []}
    for name, llm in (("whole", whole), ("cut", cut)):
        real_propose = llm.proposer.writer.propose

        def propose(rows, sampling, num_tokens=None, target_states=None, real_propose=real_propose, name=name):
            proposal = real_propose(rows, sampling, num_tokens, target_states)
            written[name].extend(proposal.draft_target_ids.flatten().tolist())   # draft ids (SLEM's writer)
            return proposal

        monkeypatch.setattr(llm.proposer.writer, "propose", propose)
    batch = ADVERSARIAL_PROMPTS + [prompts[2], prompts[5]]
    max_tokens = [20, 16, 24, 12]
    params = [SamplingParams(temperature=0, max_tokens=n) for n in max_tokens]
    outputs = cut.generate(batch, params)
    whole.generate(batch, params)
    for prompt, n, out in zip(batch, max_tokens, outputs):
        assert out.outputs[0].token_ids == reference_greedy(target_dir, prompt, n), f"prompt {prompt[:30]!r}"
    assert written["cut"] and set(written["cut"]) <= kept
    assert set(written["whole"]) - kept, "the cut never binds: choose fewer HEAD_ROWS"
    assert sum(o.metrics["num_accepted"] for o in outputs) > 0


@pytest.mark.parametrize("head_rows", [1, 151670])
def test_frequency_ranked_head_out_of_range_is_refused(slem_models, draft_vocab_corpus, head_rows):
    from anydraft.llm import LLM
    with pytest.raises(ValueError, match=r"draft_vocab_size \d+ is out of range .* at most its 151669 tokens"):
        LLM(model=str(slem_models("mistral_v0.1")), dtype="float64", device="cpu", max_model_len=64,
            speculative_config={"model": str(slem_models("mistral_v0.1", "qwen3")), "vocab_mode": "slem",
                                "draft_vocab_size": head_rows, "draft_vocab_corpus": str(draft_vocab_corpus)})
