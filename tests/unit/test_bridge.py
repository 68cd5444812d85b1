"""VocabBridge over every ordered pair of the real tokenizers, the identity fast path, and the bridge cache."""
from __future__ import annotations

import json
import os
import random
import shutil

import pytest
import torch

import anydraft.atomic_file as atomic_file
from anydraft.tokenizer import Tokenizer
from anydraft.vocab.bridge import VocabBridge
from anydraft.vocab.cache import load_or_build_bridge

NAMES = ("qwen3", "smollm2", "llama2", "mistral_v0.1", "gpt2")
PAIRS = [(target, draft) for target in NAMES for draft in NAMES if target != draft]


@pytest.fixture(scope="module")
def bridge_of(load_tokenizer):
    built: dict[tuple[str, str], VocabBridge] = {}

    def get(target: str, draft: str) -> VocabBridge:
        if (target, draft) not in built:
            built[target, draft] = VocabBridge.build(load_tokenizer(target), load_tokenizer(draft))
        return built[target, draft]

    return get


@pytest.mark.parametrize("target,draft", PAIRS)
def test_intersection_matches_independent_count(bridge_of, reference_token_bytes, load_tokenizer, target, draft):
    target_bytes, draft_bytes = reference_token_bytes(target), reference_token_bytes(draft)
    expected = len(set(target_bytes.values()) & set(draft_bytes.values()))
    bridge = bridge_of(target, draft)
    assert bridge.stats.intersection == expected
    assert not bridge.is_identity
    # Every mapped regular pair spells the same bytes (per the independent reading), both ways.
    mapped_draft_ids = torch.nonzero(bridge.draft_to_target >= 0).flatten().tolist()
    regular_pairs = [(d, int(bridge.draft_to_target[d])) for d in mapped_draft_ids if d in draft_bytes]
    assert len(regular_pairs) == expected
    assert all(draft_bytes[d] == target_bytes[t] for d, t in regular_pairs)
    assert all(int(bridge.target_to_draft[t]) == d for d, t in regular_pairs)
    # Injective both ways: no id is the image of two.
    targets = bridge.draft_to_target[bridge.draft_to_target >= 0]
    drafts = bridge.target_to_draft[bridge.target_to_draft >= 0]
    assert len(set(targets.tolist())) == len(targets) == len(drafts) == len(set(drafts.tolist()))
    assert torch.equal(bridge.draft_in_intersection, bridge.draft_to_target >= 0)
    assert bridge.pruned_draft_rows().tolist() == mapped_draft_ids
    assert sum(bridge.stats.unmatched_draft.values()) + len(mapped_draft_ids) == load_tokenizer(draft).vocab_size


def test_reported_intersections(bridge_of):
    assert bridge_of("qwen3", "llama2").stats.intersection >= 26_000
    assert 39_000 <= bridge_of("qwen3", "smollm2").stats.intersection <= 39_400
    stats = bridge_of("qwen3", "smollm2").stats
    assert stats.pct_draft == pytest.approx(100 * stats.intersection / 49152)
    assert stats.unmatched_target["partial_utf8"] > 0 and stats.unmatched_draft["special"] > 0


def test_duplicates_never_enter_the_intersection(bridge_of, load_tokenizer):
    llama = load_tokenizer("llama2")
    bridge = bridge_of("qwen3", "llama2")
    byte_piece, regular_piece = llama._hf.token_to_id("<0x41>"), llama._hf.token_to_id("A")
    assert int(bridge.draft_to_target[byte_piece]) == -1
    assert int(bridge.draft_to_target[regular_piece]) == load_tokenizer("qwen3")._hf.token_to_id("A")
    assert bridge.stats.unmatched_draft["duplicate"] > 0


def test_special_tokens_match_by_content_then_role(bridge_of, load_tokenizer):
    qwen, smol, llama = load_tokenizer("qwen3"), load_tokenizer("smollm2"), load_tokenizer("llama2")
    bridge = bridge_of("qwen3", "smollm2")
    for content in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert int(bridge.target_to_draft[qwen._hf.token_to_id(content)]) == smol._hf.token_to_id(content)
    assert int(bridge.target_to_draft[qwen._hf.token_to_id("<think>")]) == -1  # added, no counterpart
    # qwen3 -> llama2: only the eos role pairs up (<|im_end|> <-> </s>).
    bridge = bridge_of("qwen3", "llama2")
    assert int(bridge.target_to_draft[qwen.eos_token_ids[0]]) == llama.eos_token_ids[0]
    assert bridge.stats.special_matched == 1


def test_padding_rows_are_never_mapped(load_tokenizer):
    qwen, smol = load_tokenizer("qwen3"), load_tokenizer("smollm2")
    bridge = VocabBridge.build(qwen, smol, target_vocab_rows=151936, draft_vocab_rows=49152 + 64)
    assert bridge.target_to_draft.shape == (151936,) and bridge.draft_to_target.shape == (49216,)
    assert (bridge.target_to_draft[151669:] == -1).all() and (bridge.draft_to_target[49152:] == -1).all()
    assert not bridge.draft_in_intersection[49152:].any()
    # Fewer rows than token ids: the ids without a row are left out and counted.
    short = VocabBridge.build(qwen, smol, target_vocab_rows=100_000)
    assert short.stats.unmatched_target["beyond_rows"] > 0
    assert int(short.draft_to_target.max()) < 100_000
    with pytest.raises(ValueError, match="positive"):
        VocabBridge.build(qwen, smol, target_vocab_rows=0)


@pytest.mark.parametrize("name", ["qwen3", "llama2"])
def test_identity_fast_path(load_tokenizer, tmp_path, name):
    tokenizer = load_tokenizer(name)
    bridge = VocabBridge.build(tokenizer, tokenizer)
    assert bridge.is_identity and bridge.draft_to_target is None and bridge.target_to_draft is None
    assert bridge.stats.pct_target == bridge.stats.pct_draft == 100.0
    # The same files in another directory are the same vocabulary (decided by content, not path).
    for file in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer.path / file, tmp_path / file)
    assert VocabBridge.build(tokenizer, Tokenizer.from_dir(tmp_path)).is_identity
    # Different row counts would need a resize in the hot path: not the identity.
    assert not VocabBridge.build(tokenizer, tokenizer, tokenizer.vocab_size + 8, tokenizer.vocab_size).is_identity


def test_shuffled_ids_map_fully(load_tokenizer, tmp_path):
    """gpt2 with its vocabulary ids permuted (merges are by string): 100% intersection, the permutation."""
    gpt2 = load_tokenizer("gpt2")
    tokenizer_json = json.loads((gpt2.path / "tokenizer.json").read_text("utf-8"))
    vocab = tokenizer_json["model"]["vocab"]
    permutation = list(range(len(vocab)))
    random.Random(0).shuffle(permutation)
    tokenizer_json["model"]["vocab"] = {piece: permutation[i] for piece, i in vocab.items()}
    for added in tokenizer_json["added_tokens"]:
        added["id"] = permutation[added["id"]]
    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer_json))
    shutil.copy(gpt2.path / "tokenizer_config.json", tmp_path / "tokenizer_config.json")
    shuffled = Tokenizer.from_dir(tmp_path)
    assert shuffled.decode(shuffled.encode("Hello world")) == "Hello world"
    bridge = VocabBridge.build(gpt2, shuffled)
    assert not bridge.is_identity
    assert bridge.stats.intersection == 50256 and bridge.stats.special_matched == 1
    assert bridge.stats.pct_target == pytest.approx(100 * 50256 / 50257)
    assert bridge.target_to_draft.tolist() == permutation
    assert bool(bridge.draft_in_intersection.all())


# --- cache ---------------------------------------------------------------------------------------
def test_cache_cold_then_cached(load_tokenizer, tmp_path):
    qwen, smol = load_tokenizer("qwen3"), load_tokenizer("smollm2")
    cold = load_or_build_bridge(qwen, smol, 151936, 49152, cache_dir=tmp_path)
    cached = load_or_build_bridge(qwen, smol, 151936, 49152, cache_dir=tmp_path)
    assert not cold.from_cache and cached.from_cache
    assert torch.equal(cold.draft_to_target, cached.draft_to_target)
    assert torch.equal(cold.target_to_draft, cached.target_to_draft)
    assert torch.equal(cold.draft_in_intersection, cached.draft_in_intersection)
    assert cached.stats == cold.stats
    assert len(list(tmp_path.iterdir())) == 1
    # Other row counts are another entry; identity entries round-trip with None maps.
    assert not load_or_build_bridge(qwen, smol, 151936, 49216, cache_dir=tmp_path).from_cache
    load_or_build_bridge(smol, smol, cache_dir=tmp_path)
    identity = load_or_build_bridge(smol, smol, cache_dir=tmp_path)
    assert identity.from_cache and identity.is_identity and identity.draft_to_target is None


def test_cache_key_is_content_not_path(load_tokenizer, tmp_path):
    gpt2 = load_tokenizer("gpt2")
    copy_dir = tmp_path / "copy"
    copy_dir.mkdir()
    for file in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(gpt2.path / file, copy_dir / file)
    cache_dir = tmp_path / "cache"
    load_or_build_bridge(load_tokenizer("llama2"), gpt2, cache_dir=cache_dir)
    assert load_or_build_bridge(load_tokenizer("llama2"), Tokenizer.from_dir(copy_dir), cache_dir=cache_dir).from_cache


def test_env_var_sets_default_cache_dir(load_tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("ANYDRAFT_CACHE_DIR", str(tmp_path / "env_cache"))
    load_or_build_bridge(load_tokenizer("llama2"), load_tokenizer("mistral_v0.1"))
    assert len(list((tmp_path / "env_cache").glob("bridge-*.safetensors"))) == 1


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_cache_entry_is_rebuilt(load_tokenizer, tmp_path, damage):
    llama, mistral = load_tokenizer("llama2"), load_tokenizer("mistral_v0.1")
    good = load_or_build_bridge(llama, mistral, cache_dir=tmp_path)
    (entry,) = tmp_path.iterdir()
    data = entry.read_bytes()
    entry.write_bytes({"truncate": data[: len(data) // 2], "garbage": os.urandom(256), "empty": b""}[damage])
    rebuilt = load_or_build_bridge(llama, mistral, cache_dir=tmp_path)
    assert not rebuilt.from_cache and torch.equal(rebuilt.draft_to_target, good.draft_to_target)
    assert load_or_build_bridge(llama, mistral, cache_dir=tmp_path).from_cache  # and rewritten whole


def test_cache_is_never_half_written(load_tokenizer, tmp_path, monkeypatch):
    """A write that dies midway leaves no entry (and no temp file); the next call builds and stores."""
    llama, mistral = load_tokenizer("llama2"), load_tokenizer("mistral_v0.1")
    real_save_file = atomic_file.save_file

    def dying_save_file(tensors, filename, metadata=None):
        real_save_file(tensors, filename, metadata=metadata)
        with open(filename, "r+b") as partial:
            partial.truncate(100)  # what a crash midway would leave in the temp file
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic_file, "save_file", dying_save_file)
    with pytest.raises(KeyboardInterrupt):
        load_or_build_bridge(llama, mistral, cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(atomic_file, "save_file", real_save_file)
    assert not load_or_build_bridge(llama, mistral, cache_dir=tmp_path).from_cache
    assert load_or_build_bridge(llama, mistral, cache_dir=tmp_path).from_cache


def test_unwritable_cache_still_returns_a_bridge(load_tokenizer, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    bridge = load_or_build_bridge(load_tokenizer("llama2"), load_tokenizer("gpt2"), cache_dir=blocker / "sub")
    assert bridge.stats.intersection > 0 and not bridge.from_cache
