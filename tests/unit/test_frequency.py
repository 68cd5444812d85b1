"""Frequency-ranked draft heads (vocab/frequency.py): corpus reading, counting, ranking, the counts cache,
and the config's validation. No model."""
from __future__ import annotations

import json

import pytest
import torch

from anydraft.config import SpeculativeConfig
from anydraft.vocab import frequency
from anydraft.vocab.frequency import count_target_tokens, load_or_count, most_frequent, most_frequent_own_tokens, \
    read_corpus


def test_read_corpus_jsonl_joins_string_fields_of_each_line(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"question": "How many?", "answer": "#### 4", "id": 7}) + "\n\n"
                    + json.dumps("a bare string") + "\n")
    assert read_corpus(path) == ["How many?\n#### 4", "a bare string"]


def test_read_corpus_text_splits_at_blank_lines(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("first line\nsame document\n\nsecond\n\n\n")
    assert read_corpus(path) == ["first line\nsame document", "second"]


@pytest.mark.parametrize("content, message", [("", "holds no text"), ("{not json\n", ":1: not JSON")])
def test_read_corpus_rejects_empty_or_malformed_files(tmp_path, content, message):
    path = tmp_path / "c.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        read_corpus(path)
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_corpus(tmp_path / "missing.jsonl")


def test_most_frequent_ranks_by_count_then_target_id_and_always_keeps_specials():
    candidate_target_ids = torch.tensor([50, 10, 30, 20, 40, 99])    # head row -> target id (unsorted on purpose)
    counts = torch.zeros(100, dtype=torch.long)
    counts[[10, 20, 30, 40, 50]] = torch.tensor([5, 9, 5, 0, 1])     # 20 first; 10 and 30 tie: lower id first
    specials = candidate_target_ids == 99                             # count 0, kept anyway
    ranked = most_frequent(candidate_target_ids, counts, specials, 3)
    assert candidate_target_ids[ranked.keep].tolist() == [10, 20, 99]   # kept rows, in head-row order
    assert ranked.keep.tolist() == sorted(ranked.keep.tolist())
    assert ranked.corpus_tokens == 20 and ranked.coverage == pytest.approx(14 / 20)
    ranked = most_frequent(candidate_target_ids, counts, specials, 4)
    assert sorted(candidate_target_ids[ranked.keep].tolist()) == [10, 20, 30, 99]


def test_most_frequent_keeps_everything_when_the_limit_is_larger():
    ids = torch.tensor([3, 1, 2])
    ranked = most_frequent(ids, torch.ones(4, dtype=torch.long), torch.zeros(3, dtype=torch.bool), 10)
    assert ranked.keep.tolist() == [0, 1, 2] and ranked.coverage == 1.0
    with pytest.raises(ValueError, match=">= 1"):
        most_frequent(ids, torch.ones(4, dtype=torch.long), torch.zeros(3, dtype=torch.bool), 0)


def test_counts_are_the_target_tokenization(load_tokenizer):
    tokenizer = load_tokenizer("gpt2")
    documents = ["Natalia sold 48 clips.\n", "She sold half as many clips in May."]
    counts = count_target_tokens(tokenizer, documents, tokenizer.vocab_size)
    expected = torch.zeros(tokenizer.vocab_size, dtype=torch.long)
    for document in documents:
        for token_id in tokenizer.encode(document, add_special_tokens=False):
            expected[token_id] += 1
    assert torch.equal(counts, expected) and int(counts.sum()) > 10


def test_slem_head_ranks_the_drafts_own_tokenization_and_keeps_its_specials(load_tokenizer):
    """SLEM's draft writes its own tokens: its head keeps the ids its own tokenization of the corpus uses most
    (not the target's), ties by lower id, its specials whatever their count."""
    draft = load_tokenizer("mistral_v0.1")   # SentencePiece: writes " clips" as "▁cl" + "ips", " sold" whole
    documents = ["clips clips clips sold sold", "sold clips May"]
    counts = count_target_tokens(draft, documents, draft.vocab_size)
    by_count = sorted((-int(n), i) for i, n in enumerate(counts.tolist()) if n)
    specials = sorted(draft.special_ids)
    limit = len(specials) + 3
    ranked = most_frequent_own_tokens(draft, counts, draft.vocab_size, limit)
    assert ranked.keep.tolist() == sorted(specials + [i for _, i in by_count[:3]])
    assert draft.eos_token_ids[0] in ranked.keep.tolist()
    kept_words = {draft.decode([i]).strip() for _, i in by_count[:3]}
    assert kept_words == {"cl", "ips", "sold"}   # the draft's pieces of the two most used words
    assert ranked.coverage == pytest.approx(sum(-n for n, _ in by_count[:3]) / int(counts.sum()))


@pytest.mark.parametrize("limit", [0, 3, 32001])
def test_slem_head_out_of_range_says_what_to_change(load_tokenizer, limit):
    draft = load_tokenizer("mistral_v0.1")   # 32000 tokens, 3 specials (<unk>, <s>, </s>)
    counts = torch.ones(draft.vocab_size, dtype=torch.long)
    with pytest.raises(ValueError, match=f"draft_vocab_size {limit} is out of range.*more than its 3 special.*"
                                         f"at most its 32000 tokens.*unset"):
        most_frequent_own_tokens(draft, counts, draft.vocab_size, limit)
    assert len(most_frequent_own_tokens(draft, counts, draft.vocab_size, 4).keep) == 4


def test_counts_cache_is_keyed_by_corpus_contents(load_tokenizer, tmp_path, monkeypatch):
    tokenizer = load_tokenizer("gpt2")
    corpus, cache = tmp_path / "c.txt", tmp_path / "cache"
    corpus.write_text("one two three\n\nthree three")
    first = load_or_count(tokenizer, corpus, tokenizer.vocab_size, cache)
    calls = []
    real = frequency.count_target_tokens
    monkeypatch.setattr(frequency, "count_target_tokens", lambda *a: calls.append(1) or real(*a))
    assert torch.equal(load_or_count(tokenizer, corpus, tokenizer.vocab_size, cache), first) and not calls
    corpus.write_text("four")   # same path, other text: counted again
    again = load_or_count(tokenizer, corpus, tokenizer.vocab_size, cache)
    assert calls and int(again.sum()) == len(tokenizer.encode("four", add_special_tokens=False))


@pytest.mark.parametrize("fields, message", [
    ({"draft_vocab_size": 8}, "also give draft_vocab_corpus"),
    ({"draft_vocab_corpus": "c.jsonl"}, "draft_vocab_size is not"),
    ({"draft_vocab_size": 0, "draft_vocab_corpus": "c.jsonl"}, "integer >= 1"),
])
def test_config_says_what_to_change(fields, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig(model="d", **fields)


def test_coverage_report_on_hand_made_counts():
    from anydraft.vocab.frequency import coverage_report
    counts = torch.zeros(10, dtype=torch.long)
    counts[[1, 2, 3, 7]] = torch.tensor([60, 30, 9, 1])     # token 7 (count 1) cannot be proposed
    candidates = torch.tensor([3, 1, 2, 0])                 # token 0: proposable, never used
    report = coverage_report(candidates, counts, torch.zeros(4, dtype=torch.bool), [1, 2, 8])
    assert report["corpus_tokens"] == 100 and report["proposable_pct"] == 99.0 and report["distinct_used"] == 3
    assert report["cuts"] == [{"size": 1, "coverage_pct": round(100 * 60 / 99, 3)},
                              {"size": 2, "coverage_pct": round(100 * 90 / 99, 3)}]   # 8 >= 4 candidates: left out
    assert report["size_for_coverage"] == {"0.99": 3, "0.999": 3}
