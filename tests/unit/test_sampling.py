"""logits_to_probs against a direct per-row reference; inverse-CDF sampling; per-row noise."""
from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from anydraft.spec_decode.sampling import RowRandom, draw_keys, draw_noise, logits_to_probs, sample_from_probs

P_VALUE_MIN = 1e-3


def reference_probs(logits_row: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """One row [V] the obvious way, in float64: temperature, keep the k largest, smallest prefix >= top_p."""
    logits_row = logits_row.double()
    if temperature == 0:
        return torch.nn.functional.one_hot(logits_row.argmax(), logits_row.numel()).double()
    scaled = logits_row / temperature
    if top_k > 0:
        keep = torch.zeros_like(scaled, dtype=torch.bool)
        keep[scaled.argsort(descending=True)[:top_k]] = True
        scaled = scaled.masked_fill(~keep, float("-inf"))
    probs = scaled.softmax(-1)
    if top_p < 1.0:
        order = probs.argsort(descending=True)
        cumulative = probs[order].cumsum(0)
        num_kept = int((cumulative < top_p).sum()) + 1
        keep = torch.zeros_like(probs, dtype=torch.bool)
        keep[order[:num_kept]] = True
        probs = probs * keep
        probs = probs / probs.sum()
    return probs


def test_logits_to_probs_matches_reference_per_row():
    generator = torch.Generator().manual_seed(0)
    settings = [  # (temperature, top_k, top_p): off, each alone, combined, greedy in the same batch
        (1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 5, 1.0), (1.0, -1, 0.8),
        (0.5, 10, 0.9), (0.0, 3, 0.5), (2.0, 1, 1.0), (1.0, 40, 0.3),
    ]
    logits = torch.randn(len(settings), 3, 32, generator=generator) * 2.0
    temperature = torch.tensor([s[0] for s in settings])
    top_k = torch.tensor([s[1] for s in settings])
    top_p = torch.tensor([s[2] for s in settings])
    probs = logits_to_probs(logits, temperature, top_k, top_p)
    assert probs.dtype == torch.float32 and probs.shape == logits.shape
    for row, (t, k, p) in enumerate(settings):
        for pos in range(logits.shape[1]):
            expected = reference_probs(logits[row, pos], t, k, p)
            torch.testing.assert_close(probs[row, pos].double(), expected, atol=1e-6, rtol=1e-5)
            assert torch.equal(probs[row, pos] > 0, expected > 0), (row, pos)


def test_top_k_top_p_over_a_large_vocabulary_selects_then_sorts_where_it_must(monkeypatch):
    """Over more than TOP_SELECTED logits the cut is looked for among the largest (topk); where they do not decide
    it (top_k past them, a nucleus wider than them, ties with the k-th past them) the whole sort runs. Either way
    every row equals the reference; both paths run here."""
    import anydraft.spec_decode.sampling as sampling
    vocab = 2000
    generator = torch.Generator().manual_seed(5)
    peaked = torch.randn(vocab, generator=generator) * 4.0     # a narrow nucleus: the selection decides
    flat = torch.randn(vocab, generator=generator) * 0.1       # a nucleus of most of the vocabulary: the sort
    tied = peaked.clone()
    tied[tied.argsort(descending=True)[10:400]] = tied.sort(descending=True).values[10]   # 390 ties with the 11th
    settings = [  # (logits, temperature, top_k, top_p)
        (peaked, 0.7, 0, 0.9), (peaked, 1.0, 20, 0.95), (peaked, 0.6, 20, 1.0), (peaked, 1.0, 300, 1.0),
        (flat, 1.0, 0, 0.95), (flat, 0.8, 50, 0.9), (tied, 1.0, 11, 0.99), (tied, 1.0, 5, 0.8),
    ]
    calls = []
    cutoff = sampling.cutoff_from_top
    monkeypatch.setattr(sampling, "cutoff_from_top", lambda top, *a: calls.append(
        (top.shape[-1], (result := cutoff(top, *a)) is None)) or result)
    def probs_of(logits_row, t, k, p):
        return logits_to_probs(logits_row.view(1, 1, vocab), torch.tensor([t]), torch.tensor([k]),
                               torch.tensor([p]))[0, 0]
    selected = [probs_of(*setting) for setting in settings]
    for (logits_row, t, k, p), probs in zip(settings, selected):
        if logits_row is not tied:   # the reference keeps exactly k of tied logits; the rule keeps every tie
            expected = reference_probs(logits_row, t, k, p)
            torch.testing.assert_close(probs.double(), expected, atol=1e-6, rtol=1e-5)
            assert torch.equal(probs > 0, expected > 0), (t, k, p)
    assert (tied_kept := int((selected[6] > 0).sum())) >= 400, tied_kept   # the 11th and its 389 ties past it
    with monkeypatch.context() as whole:   # the same cut from the whole sort, every row
        whole.setattr(sampling, "TOP_SELECTED", vocab)
        for setting, probs in zip(settings, selected):
            torch.testing.assert_close(probs_of(*setting), probs, atol=1e-7, rtol=1e-6)
            assert torch.equal(probs_of(*setting) > 0, probs > 0)
    assert (sampling.TOP_SELECTED, False) in calls and (sampling.TOP_SELECTED, True) in calls   # decided, and not
    assert (vocab, False) in calls   # the sort ran where the selection did not decide
    # a batch mixing both kinds of rows: one sort for all, the same probabilities
    logits = torch.stack([peaked, flat]).view(2, 1, vocab)
    mixed = logits_to_probs(logits, torch.tensor([0.7, 1.0]), torch.tensor([0, 0]), torch.tensor([0.9, 0.95]))
    for row, (t, p) in enumerate([(0.7, 0.9), (1.0, 0.95)]):
        torch.testing.assert_close(mixed[row, 0].double(), reference_probs(logits[row, 0], t, 0, p), atol=1e-6,
                                   rtol=1e-5)


def test_a_nucleus_past_the_first_selection_is_found_among_the_wide_one(monkeypatch):
    """A nucleus of a few thousand tokens: not among the 256 largest, decided among TOP_SELECTED_WIDE, equal to the
    reference and to the whole sort."""
    import anydraft.spec_decode.sampling as sampling
    vocab = 20_000
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(9)) * 3.0   # a nucleus of 953
    calls = []
    cutoff = sampling.cutoff_from_top
    monkeypatch.setattr(sampling, "cutoff_from_top", lambda top, *a: calls.append(
        (top.shape[-1], (result := cutoff(top, *a)) is None)) or result)
    probs = logits_to_probs(logits.view(1, 1, vocab), torch.ones(1), top_p=torch.tensor([0.9]))[0, 0]
    assert calls == [(sampling.TOP_SELECTED, True), (sampling.TOP_SELECTED_WIDE, False)]
    kept = int((probs > 0).sum())
    assert sampling.TOP_SELECTED < kept < sampling.TOP_SELECTED_WIDE, kept
    expected = reference_probs(logits, 1.0, 0, 0.9)
    torch.testing.assert_close(probs.double(), expected, atol=1e-6, rtol=1e-5)
    assert torch.equal(probs > 0, expected > 0)


def test_none_top_k_top_p_equals_off_values():
    logits = torch.randn(3, 2, 50, generator=torch.Generator().manual_seed(1))
    temperature = torch.tensor([0.8, 0.0, 1.5])
    skipped = logits_to_probs(logits, temperature)
    off = logits_to_probs(logits, temperature, torch.tensor([0, -1, 0]), torch.ones(3))
    torch.testing.assert_close(skipped, off)


def test_any_greedy_false_skips_only_the_one_hot():
    """any_greedy=False (no greedy row in the batch) gives the same probabilities; with a greedy row it would not."""
    logits = torch.randn(3, 2, 50, generator=torch.Generator().manual_seed(6))
    sampled = torch.tensor([0.8, 1.0, 1.5])
    assert torch.equal(logits_to_probs(logits, sampled, any_greedy=False), logits_to_probs(logits, sampled))
    mixed = torch.tensor([0.8, 0.0, 1.5])
    assert not torch.equal(logits_to_probs(logits, mixed, any_greedy=False), logits_to_probs(logits, mixed))


def test_top_p_one_keeps_tail_tokens_whose_mass_rounds_away():
    # In float32 the cumulative mass reaches 1.0 before the tail: top_p = 1.0 must still mean "off".
    logits = torch.tensor([[[10.0, 0.0, -20.0, -30.0]]])
    probs = logits_to_probs(logits, torch.ones(1), top_p=torch.ones(1))
    assert (probs > 0).all()
    assert torch.equal(probs, logits_to_probs(logits, torch.ones(1)))


def test_greedy_rows_are_one_hot_of_argmax():
    logits = torch.randn(2, 4, 20, generator=torch.Generator().manual_seed(2))
    probs = logits_to_probs(logits, torch.tensor([0.0, 1.0]), torch.tensor([5, 5]), torch.tensor([0.9, 0.9]))
    expected = torch.nn.functional.one_hot(logits[0].argmax(-1), 20).float()
    assert torch.equal(probs[0], expected)
    assert (probs[1] > 0).sum(-1).max() > 1  # the sampled row stays a distribution


def test_neg_inf_logits_get_exactly_zero_and_no_nan():
    logits = torch.randn(4, 2, 10, generator=torch.Generator().manual_seed(3))
    logits[:, :, 7:] = float("-inf")          # padding vocab rows
    logits[1, 0, :] = float("-inf")
    logits[1, 0, 4] = 0.5                     # all -inf except one
    logits[2, 1, :] = float("-inf")           # fully masked: no distribution, but no NaN either
    temperature = torch.tensor([1.0, 0.6, 1.0, 0.0])
    for top_k, top_p in [(None, None), (torch.tensor([3, 2, 0, 4]), torch.tensor([0.9, 0.5, 1.0, 0.7]))]:
        probs = logits_to_probs(logits, temperature, top_k, top_p)
        assert not probs.isnan().any()
        assert (probs[:, :, 7:] == 0).all()
        assert probs[1, 0, 4] == 1.0 and probs[1, 0].sum() == 1.0
        assert (probs[2, 1] == 0).all()
        torch.testing.assert_close(probs[0].sum(-1), torch.ones(2))


def test_dtypes_float64_kept_half_computed_in_float32():
    logits = torch.randn(2, 1, 16, dtype=torch.float64)
    assert logits_to_probs(logits, torch.ones(2)).dtype == torch.float64
    bf16 = logits_to_probs(logits.bfloat16(), torch.ones(2), torch.tensor([4, 0]), torch.tensor([1.0, 0.9]))
    assert bf16.dtype == torch.float32
    torch.testing.assert_close(bf16.sum(-1), torch.ones(2, 1))


def test_tied_logits_at_top_k_boundary_are_all_kept():
    logits = torch.tensor([[[3.0, 1.0, 1.0, 1.0, 0.0]]])
    probs = logits_to_probs(logits, torch.ones(1), top_k=torch.tensor([2]))
    assert torch.equal(probs[0, 0] > 0, torch.tensor([True, True, True, True, False]))


def _chi_square_p_value(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """Goodness of fit of integer samples to probs [V]; tokens with probability 0 must never appear."""
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    probs = probs.double()
    support = probs > 0
    assert counts[~support].sum() == 0, "a zero-probability token was drawn"
    expected = probs[support] / probs[support].sum() * samples.numel()
    return float(chisquare(counts[support].numpy(), expected.numpy()).pvalue)


def test_sample_from_probs_is_distributed_as_probs():
    num_samples = 20000
    probs = torch.tensor([0.05, 0.0, 0.4, 0.25, 0.0, 0.2, 0.1])
    generator = torch.Generator().manual_seed(4)
    uniforms = torch.rand(num_samples, generator=generator, dtype=torch.float64)
    samples = sample_from_probs(probs.expand(num_samples, -1), uniforms)
    assert samples.shape == (num_samples,)
    assert _chi_square_p_value(samples, probs) > P_VALUE_MIN
    # Negative control: the same statistic rejects a slightly different distribution.
    shifted = torch.tensor([0.08, 0.0, 0.37, 0.25, 0.0, 0.2, 0.1])
    assert _chi_square_p_value(samples, shifted) < P_VALUE_MIN


def test_sample_from_probs_unnormalized_and_zero_probability_never_drawn():
    probs = torch.tensor([[0.0, 2.0, 0.0, 6.0, 0.0]]).expand(5, -1)   # token 1 owns [0, 0.25), token 3 [0.25, 1)
    uniforms = torch.tensor([0.0, 0.25 - 2 ** -40, 0.25, 0.5, 1 - 2 ** -53], dtype=torch.float64)
    assert sample_from_probs(probs, uniforms).tolist() == [1, 1, 3, 3, 3]


@pytest.mark.parametrize("vocab", [4096, 39237, 151936])
def test_two_level_draw_equals_one_cumulative_sum(vocab):
    """Large vocabularies draw chunk then token; that picks the token a float64 cumulative sum over the whole row
    picks (zero-mass tokens, a partial last chunk and u near 0 and 1 included)."""
    generator = torch.Generator().manual_seed(vocab)
    probs = torch.softmax(torch.randn(64, vocab, generator=generator) * 4, -1)
    probs[:, ::7] = 0.0
    probs[:8, -300:] = 0.0                                  # the last chunk (or two) without mass
    uniforms = torch.rand(64, generator=generator, dtype=torch.float64)
    uniforms[:4] = torch.tensor([0.0, 2 ** -50, 1 - 2 ** -53, 0.5], dtype=torch.float64)
    cdf = probs.double().cumsum(-1)
    expected = torch.searchsorted(cdf, (uniforms[:, None] * cdf[:, -1:]), right=True).squeeze(-1)
    drawn = sample_from_probs(probs, uniforms)
    assert (probs.gather(-1, drawn[:, None]) > 0).all()
    # The two sum orders may round apart only when u * total falls within ~1e-16 of a token boundary.
    assert (drawn == expected).sum() >= 63


def test_sample_from_probs_two_level_is_distributed_as_probs():
    """Chi-square on a 5000-token vocabulary (two-level path): a few heavy tokens in different chunks and a tail;
    negative control: the same statistic rejects probabilities moved by a little between two tokens."""
    vocab, num_samples = 5000, 20000
    probs = torch.full((vocab,), 0.2 / (vocab - 5))
    heavy = torch.tensor([3, 700, 1500, 2560, 4999])
    probs[heavy] = torch.tensor([0.3, 0.2, 0.15, 0.1, 0.05])
    samples = sample_from_probs(probs.expand(num_samples, -1),
                                torch.rand(num_samples, generator=torch.Generator().manual_seed(8), dtype=torch.float64))
    binned = torch.where(torch.isin(samples, heavy), samples, -1)
    def p_value(law):
        observed = [int((binned == t).sum()) for t in heavy.tolist()] + [int((binned == -1).sum())]
        expected = [float(law[t]) * num_samples for t in heavy.tolist()]
        return float(chisquare(observed, expected + [num_samples - sum(expected)]).pvalue)
    assert p_value(probs) > P_VALUE_MIN
    shifted = probs.clone()
    shifted[3], shifted[700] = 0.285, 0.215
    assert p_value(shifted) < P_VALUE_MIN


def test_sample_from_probs_resolves_tail_tokens_of_a_large_vocabulary():
    """Tail tokens of mass 1e-12 next to a head of mass 1 (151936 entries, float32 probs) each own their share of
    u: u spread evenly over the tail's share draws tokens spread evenly over the tail, within a token or two.
    Control: a float32 cumulative sum cannot tell the tail tokens apart (their intervals are empty)."""
    vocab = 151936
    probs = torch.full((vocab,), 1e-12)
    probs[0] = 1.0
    total = probs.double().sum()
    tail_mass = float(probs[1].double())
    fractions = (torch.arange(1000, dtype=torch.float64) + 0.5) / 1000
    uniforms = (1.0 + fractions * (total - 1.0)) / total
    drawn = sample_from_probs(probs[None].expand(1000, -1), uniforms)
    expected = 1 + ((uniforms * total - 1.0) / tail_mass).floor()
    assert (drawn - expected).abs().max() <= 2
    cdf32 = probs.cumsum(0)
    assert cdf32[5000] == cdf32[4999]   # in float32 the token's interval is empty: it could never be drawn


def test_row_random_seed_reproduces():
    a, b = RowRandom(123), RowRandom(123)
    assert torch.equal(a.uniform(5), b.uniform(5))
    assert torch.equal(a.uniform(3, torch.float64), b.uniform(3, torch.float64))
    assert not torch.equal(RowRandom(123).uniform(5), RowRandom(124).uniform(5))
    assert RowRandom(None).uniform(4).shape == (4,)


def test_a_noise_key_depends_on_the_request_and_the_output_position_only():
    """The key of a row's output position n is the same however the positions are grouped into steps (k + 1 per
    step, k varying), whichever rows share the batch: what makes a seeded request sample the same tokens with any k."""
    whole = draw_keys([RowRandom(7)], [0], 12, "cpu")[0]                                   # [12]
    emitted, position = [], 0
    for num, kept in ((1, 1), (4, 2), (2, 2), (6, 3), (1, 1)):   # (k + 1 keys, tokens the step emitted)
        keys = draw_keys([RowRandom(3), RowRandom(7), RowRandom(None)], [5, position, 0], num, "cpu")   # [3, num]
        emitted.append(keys[1, :kept])   # a rejected position's key comes again in the next step's first
        position += kept
    assert torch.equal(torch.cat(emitted), whole[:position])
    assert whole.dtype == torch.int64 and len(set(whole.tolist())) == 12
    assert not torch.equal(draw_keys([RowRandom(8)], [0], 12, "cpu")[0], whole)               # another seed
    assert not torch.equal(draw_keys([RowRandom(None)], [0], 12, "cpu")[0], whole)            # unseeded: random
    signed = draw_keys([RowRandom(-7), RowRandom(2 ** 64 - 7), RowRandom(2 ** 63)], [0, 0, 0], 4, "cpu")
    assert torch.equal(signed[0], signed[1]) and not torch.equal(signed[0][:4], whole[:4])   # seeds modulo 2**64
    # Every bit of a key is a fair coin over positions and seeds (keys one position apart are unrelated).
    keys = draw_keys([RowRandom(s) for s in range(64)], list(range(64)), 64, "cpu").flatten()   # [4096]
    bits = ((keys[:, None] >> torch.arange(64)) & 1).double().mean(0)                      # [64]
    assert ((bits - 0.5).abs() < 0.04).all(), bits   # 4096 draws: sd 0.008, 5 sd


def test_draw_noise_per_row_independent_of_batch_mates():
    k = 3
    uniforms_a, tokens_a = draw_noise([RowRandom(7), RowRandom(None)], k, "cpu")
    uniforms_b, tokens_b = draw_noise([RowRandom(99), RowRandom(5), RowRandom(7)], k, "cpu")
    assert uniforms_a.shape == (2, k) and tokens_a.shape == (2,) and tokens_a.dtype == torch.float64
    assert torch.equal(uniforms_a[0], uniforms_b[2])
    assert torch.equal(tokens_a[0], tokens_b[2])
    assert ((tokens_b >= 0) & (tokens_b < 1)).all() and ((uniforms_b >= 0) & (uniforms_b < 1)).all()


def test_draw_noise_greedy_rows_get_constant_noise():
    uniforms, token_uniforms = draw_noise([None, RowRandom(1)], 2, "cpu")
    assert (uniforms[0] == 0).all() and token_uniforms[0] == 0
    assert token_uniforms[1] != 0


@pytest.mark.parametrize("temperature", [0.5, 1.0])
def test_sampling_pipeline_matches_softmax(temperature: float):
    """logits_to_probs + sample_from_probs, drawn as one big batch, follows softmax(logits / T)."""
    num_samples = 20000
    logits = torch.tensor([1.0, -0.5, 0.3, 2.0, float("-inf"), 0.0])
    probs = logits_to_probs(logits.expand(num_samples, 1, -1), torch.full((num_samples,), temperature))
    uniforms = torch.rand(num_samples, 1, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    samples = sample_from_probs(probs, uniforms)[:, 0]
    assert _chi_square_p_value(samples, (logits / temperature).softmax(-1)) > P_VALUE_MIN


@pytest.mark.parametrize("vocab", [5, 4095, 4096, 39237, 49152, 151936])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_greedy_argmax_equals_torch_argmax_including_ties(vocab, dtype):
    """The two-pass argmax (chunk maxima, then inside the winning chunk) returns torch.argmax's index:
    the first of equal maxima, also when they sit in different chunks or in the short last chunk."""
    from anydraft.tensors import greedy_argmax
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(3, 5, vocab, generator=g).to(dtype)
    # Coarse values make many exact ties (bf16 rounds them further).
    coarse = (torch.randn(4, vocab, generator=g) * 2).round().to(dtype)
    edge = torch.zeros(4, vocab, dtype=dtype)
    edge[0, -1] = 1                                     # the maximum in the last (possibly short) chunk
    edge[1, [vocab // 3, vocab - 1]] = 2                # a tie across chunks
    edge[2, :] = float("-inf")
    edge[2, vocab // 2] = -1e30                         # everything else -inf (padding/masked rows)
    nan = logits[0].clone()
    nan[0, vocab // 2] = float("nan")                   # torch.argmax treats NaN as the largest value
    nan[1, [vocab - 1, 1]] = float("nan")
    strided = torch.randn(2, vocab, 3, generator=g).to(dtype)[..., 1]   # last dim not contiguous
    for case in (logits, coarse, edge, nan, strided):
        assert torch.equal(greedy_argmax(case), case.argmax(dim=-1)), case
