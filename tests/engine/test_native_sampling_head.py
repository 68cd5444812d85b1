"""The native sampling head (NativeHead.sample, csrc/sampling_head.cpp): its token is the Gumbel-max over ALL head rows
with the documented counter-based noise, built by blocks of 16 ids (checked against a brute-force float64 reference
that computes every logit and every id's noise; the noise itself is iid Gumbel), whatever the batch around a row; and
its draws are distributed as softmax(logits / T) (chi-square, with negative controls: a wrong temperature and a wrong
noise law are rejected by the same test)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from anydraft.model.native_extension import load_extension
from anydraft.model.native_head import NativeHead

from test_native_decoder import SCREENED

pytestmark = pytest.mark.skipif(SCREENED is not None, reason=f"hardware: {SCREENED}")

P_VALUE_MIN = 1e-3
MASK32 = np.uint64(0xFFFFFFFF)


def _lowbias32(x: np.ndarray) -> np.ndarray:   # uint64 arrays holding 32-bit values
    x = x ^ (x >> np.uint64(16))
    x = (x * np.uint64(0x7FEB352D)) & MASK32
    x = x ^ (x >> np.uint64(15))
    x = (x * np.uint64(0x846CA68B)) & MASK32
    return x ^ (x >> np.uint64(16))


def _uniforms(key: int, counters: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's uniform stream (sampling_head.cpp): z = hash_high << 32 | hash_low of each counter, and
    u = ((z >> 11) + 1/2) 2^-53; returns (u, z)."""
    key &= (1 << 64) - 1
    k0, k1 = np.uint64(key & 0xFFFFFFFF), np.uint64(key >> 32)
    n = counters.astype(np.uint64)
    high = _lowbias32(_lowbias32((n * np.uint64(0x9E3779B9) + k0) & MASK32) ^ k1)
    low = _lowbias32(_lowbias32((n * np.uint64(0x85EBCA6B) + k1) & MASK32) ^ k0 ^ np.uint64(0x5BD1E995))
    z = (high << np.uint64(32)) | low
    return ((z >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53, z


def _noise(key: int, ids: np.ndarray) -> np.ndarray:
    """The kernel's noise of each id, as its header says, written again: the largest of its block of 16 ids
    (id >> 4), -log(w0 / 16) with w0 = -log u0, sits at lane z0 & 15; every other id draws -log(w0 / 16 - log u)."""
    ids = ids.astype(np.int64)
    u0, z0 = _uniforms(key, (ids >> 4) | 0x80000000)
    u, _ = _uniforms(key, ids)
    w0 = -np.log(u0)
    at_max = (ids & 15) == (z0 & np.uint64(15)).astype(np.int64)
    return np.where(at_max, -np.log(w0 / 16), -np.log(w0 / 16 - np.log(u)))


def _reference(head: NativeHead, hidden: torch.Tensor, num_rows: int, temperature: torch.Tensor,
               keys: torch.Tensor, noise_ids: np.ndarray | None = None) -> torch.Tensor:
    """Brute force: every logit (head.logits), every row's float64 Gumbel (of its noise id), the argmax (lowest row
    on ties)."""
    ids = None if noise_ids is None else noise_ids[:num_rows]
    logits = head.logits(hidden.reshape(-1, hidden.shape[-1]))[:, :num_rows].double().numpy()   # [M, N]
    rows = np.arange(num_rows)
    out = []
    for m in range(logits.shape[0]):
        perturbed = logits[m] * (1.0 / float(temperature[m])) + _noise(int(keys[m]), rows if ids is None else ids)
        out.append(int(np.argmax(perturbed)))
    return torch.tensor(out).view(hidden.shape[:-1])


def _head(rows: int, width: int = 128, seed: int = 0, scale: float = 0.05) -> NativeHead:
    weight = (torch.randn(rows, width, generator=torch.Generator().manual_seed(seed)) * scale).bfloat16()
    return NativeHead(weight, load_extension())


def _keys(count: int, seed: int) -> torch.Tensor:
    return torch.randint(-2 ** 63, 2 ** 63 - 1, (count,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("temperature", [0.3, 0.7, 1.0, 2.5])
def test_sample_is_the_gumbel_max_over_every_row(temperature):
    head = _head(5000)
    hidden = (torch.randn(3, 5, 128, generator=torch.Generator().manual_seed(1)) * 4).bfloat16()
    temps, keys = torch.full((15,), temperature), _keys(15, 2)
    drawn = head.sample(hidden, 5000, temps, keys)
    assert drawn.shape == (3, 5)
    assert torch.equal(drawn, _reference(head, hidden, 5000, temps, keys))


@pytest.mark.parametrize("temperature", [0.5, 8.0])
def test_rows_past_the_probe_are_screened_without_losing_the_winner(temperature):
    """A 20000-row head: past its first 1024 rows (the probe) a row is kept only if its score plus the largest
    noise could reach the best value found; at T = 8 the noise decides and many rows stay. 64 draws, exact."""
    head = _head(20000, seed=15, scale=0.1)
    hidden = (torch.randn(64, 128, generator=torch.Generator().manual_seed(16)) * 3).bfloat16()
    temps, keys = torch.full((64,), temperature), _keys(64, 17)
    drawn = head.sample(hidden, 20000, temps, keys)
    assert torch.equal(drawn, _reference(head, hidden, 20000, temps, keys))
    assert (drawn >= 1024).float().mean() > 0.5   # most winners lie past the probe


@pytest.mark.parametrize("temperature", [0.5, 1.0, 8.0])
def test_a_head_over_other_ids_draws_each_row_with_its_id_s_noise(temperature):
    """A draft's head stands for target ids (noise_ids: sparse, out of order, each head block spanning many noise
    blocks): each row draws with its id's noise, and the draw is the exact Gumbel-max over every row."""
    head = _head(3000, seed=18, scale=0.1)
    ids = np.random.default_rng(19).choice(150_000, 3000, replace=False)
    hidden = (torch.randn(8, 128, generator=torch.Generator().manual_seed(20)) * 3).bfloat16()
    temps, keys = torch.full((8,), temperature), _keys(8, 21)
    drawn = head.sample(hidden, 3000, temps, keys, torch.from_numpy(ids))
    assert torch.equal(drawn, _reference(head, hidden, 3000, temps, keys, ids))
    assert not torch.equal(drawn, head.sample(hidden, 3000, temps, keys))   # the ids' noise, not the rows'


def test_the_noise_by_blocks_is_iid_gumbel_with_a_negative_control():
    """The kernel's noise (equal to _noise by the exact tests above) built by blocks: every lane of a block is
    Gumbel(0, 1) and the lanes are uncorrelated; the block's maximum alone is not (a control: the same uniforms
    with the other lanes not truncated below it fail the same test)."""
    from scipy.stats import kstest
    ids = np.arange(16 * 4096)
    g = np.stack([_noise(key, ids) for key in range(4)]).reshape(-1, 16)              # [blocks, 16]
    gumbel_cdf = lambda x: np.exp(-np.exp(-x))   # noqa: E731
    for lane in (0, 7, 15):
        assert kstest(g[:, lane], gumbel_cdf).pvalue > P_VALUE_MIN
    correlations = np.corrcoef(g.T)[np.triu_indices(16, 1)]
    assert np.abs(correlations).max() < 0.03   # 16k blocks: sd 0.008
    u0, z0 = _uniforms(0, (ids >> 4) | 0x80000000)
    u, _ = _uniforms(0, ids)
    untruncated = np.where((ids & 15) == (z0 & np.uint64(15)).astype(np.int64), -np.log(-np.log(u0) / 16),
                           -np.log(-np.log(u)))
    assert kstest(untruncated, gumbel_cdf).pvalue < P_VALUE_MIN


@pytest.mark.parametrize("rows, k, hidden_scale", [(5000, 20, 4.0), (20000, 256, 3.0), (3000, 1, 3.0),
                                                    (1000, 300, 0.01)])
def test_top_is_the_k_largest_logits_ties_to_the_lower_row(rows, k, hidden_scale):
    """NativeHead.top: the k largest of logits() (bf16 values: ties are common) and their rows, larger first and the
    lower row first among equals, screened; a near-zero hidden state (a flat screen: every row a candidate) and a
    non-finite one (no usable screen) take every row."""
    head = _head(rows, seed=rows)
    hidden = (torch.randn(7, 128, generator=torch.Generator().manual_seed(k)) * hidden_scale).bfloat16()
    hidden[6] = float("nan")
    values, top_rows, no_mass = head.top(hidden, rows - 3, k)
    assert no_mass is None
    logits = head.logits(hidden)[:, :rows - 3].float()
    for m in range(6):
        order = sorted(range(rows - 3), key=lambda n: (-float(logits[m, n]), n))[:k]
        assert top_rows[m].tolist() == order and torch.equal(values[m], logits[m, order])
    assert top_rows[6].shape == (k,) and (top_rows[6] < rows - 3).all()


@pytest.mark.parametrize("rows, k, hidden_scale, screened", [(5000, 20, 4.0, True), (5000, 20, 20.0, True),
                                                              (20000, 288, 3.0, False), (3000, 1, 0.0, False)])
def test_top_bounds_the_mass_of_the_other_rows(rows, k, hidden_scale, screened):
    """NativeHead.top given temperatures: bounds on log sum exp(logit / T) over the rows below num_rows that are not
    among the k, each within a factor of 2 of it where the screen left rows out (a quarter power of two, and the
    screen's slack); both exact where every row was computed (a flat screen: hidden 0, or too many rows the screen
    cannot rule out)."""
    head = _head(rows, seed=rows + 1)
    hidden = (torch.randn(8, 128, generator=torch.Generator().manual_seed(k + 1)) * hidden_scale).bfloat16()
    hidden[7] = float("nan") if hidden_scale else 0.0
    temperature = torch.tensor([0.3, 0.6, 0.7, 1.0, 1.5, 2.0, 0.7, 0.7], dtype=torch.float64)
    values, top_rows, rest = head.top(hidden, rows - 3, k, temperature)
    logits = head.logits(hidden)[:, :rows - 3].double()
    looser = 0
    for m in range(7):
        others = torch.ones(rows - 3, dtype=torch.bool)
        others[top_rows[m]] = False
        exact = torch.logsumexp(logits[m, others] / temperature[m], dim=0).item()
        lower, upper = rest[m].tolist()
        assert lower - 1e-9 <= exact <= upper + 1e-9, (m, exact, lower, upper)
        assert exact - math.log(2) <= lower and upper <= exact + math.log(2), (m, exact, lower, upper)
        looser += upper > exact + 1e-6
        assert screened or abs(lower - exact) < 1e-9
    assert bool(looser) == screened   # bounds where the screen left rows out; exact where every row was computed


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_floors_restrict_the_draw_to_the_rows_reaching_them(temperature):
    """sample(floors=...): the Gumbel-max over the rows whose logit is at least the row's floor (a top-p cut keeps
    such a prefix), exactly; without the floor the same keys draw elsewhere."""
    head = _head(6000, seed=22, scale=0.1)
    hidden = (torch.randn(16, 128, generator=torch.Generator().manual_seed(23)) * 3).bfloat16()
    temps, keys = torch.full((16,), temperature), _keys(16, 24)
    logits = head.logits(hidden)[:, :6000].float()
    floors = logits.sort(dim=-1, descending=True).values[:, 4]   # the 5 largest (and any ties) take part
    drawn = head.sample(hidden, 6000, temps, keys, floors=floors)
    for m in range(16):
        kept = torch.nonzero(logits[m] >= floors[m]).flatten().numpy()
        perturbed = logits[m, kept].double().numpy() * (1.0 / temperature) + _noise(int(keys[m]), kept)
        assert int(drawn[m]) == int(kept[np.argmax(perturbed)])
    assert not torch.equal(drawn, head.sample(hidden, 6000, temps, keys))


def test_noise_is_the_sampling_head_s_for_any_ids():
    head = _head(100, seed=3)
    keys, ids = _keys(3, 5), torch.randint(0, 150_000, (3, 9), generator=torch.Generator().manual_seed(6))
    expected = np.stack([_noise(int(keys[m]), ids[m].numpy()) for m in range(3)])
    assert np.array_equal(head.noise(keys, ids).numpy(), expected)


def test_sample_of_a_row_does_not_depend_on_its_batch():
    head = _head(3000, seed=4)
    hidden = (torch.randn(13, 128, generator=torch.Generator().manual_seed(5)) * 3).bfloat16()
    temps = torch.linspace(0.2, 1.5, 13)
    keys = _keys(13, 6)
    together = head.sample(hidden, 3000, temps, keys)
    alone = torch.cat([head.sample(hidden[i:i + 1], 3000, temps[i:i + 1], keys[i:i + 1]) for i in range(13)])
    assert torch.equal(together, alone)
    reordered = head.sample(hidden.flip(0), 3000, temps.flip(0), keys.flip(0)).flip(0)
    assert torch.equal(together, reordered)
    assert torch.equal(together, _reference(head, hidden, 3000, temps, keys))


def test_sample_respects_num_rows_and_degenerate_hidden_states():
    head = _head(1000, seed=7)
    # one huge outlier (a repeated token's hidden state): the int8 screen is coarse, every row survives it
    hidden = torch.zeros(4, 128)
    hidden[:, 3] = 300.0
    hidden[:, 5] = torch.tensor([0.01, -0.02, 0.03, 0.0])
    hidden = hidden.bfloat16()
    temps, keys = torch.full((4,), 0.7), _keys(4, 8)
    drawn = head.sample(hidden, 700, temps, keys)
    assert (drawn < 700).all()
    assert torch.equal(drawn, _reference(head, hidden, 700, temps, keys))


def _chi_square_p_value(samples: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """Goodness of fit of samples to probs [V], tokens with an expected count under min_expected pooled."""
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    expected = probs.double() / probs.double().sum() * samples.numel()
    big = expected >= min_expected
    observed = torch.cat([counts[big], counts[~big].sum()[None]])
    wanted = torch.cat([expected[big], expected[~big].sum()[None]])
    return float(chisquare(observed.numpy(), wanted.numpy()).pvalue)


def test_samples_are_distributed_as_the_softmax_with_negative_controls():
    """40k draws of one hidden state (each row of the batch its own key): fit to softmax(logits / 0.7) in float64;
    the same test rejects the softmax at temperature 0.8, and rejects draws made with a wrong noise (Gumbel-max
    with uniform instead of Gumbel noise) from the same logits."""
    vocab, temperature, draws = 400, 0.7, 40_000
    head = _head(vocab, width=64, seed=9, scale=0.08)
    hidden = (torch.randn(1, 64, generator=torch.Generator().manual_seed(10)) * 1.5).bfloat16()
    logits = head.logits(hidden)[0].double()                        # [V] the values sample() draws from
    exact = (logits / temperature).softmax(-1)
    assert exact.max() < 0.5 and (exact > 1e-3).sum() > 50          # a spread distribution: a test with power
    batch = hidden.expand(draws, 64)
    samples = head.sample(batch, vocab, torch.full((draws,), temperature), _keys(draws, 11))
    assert _chi_square_p_value(samples, exact) > P_VALUE_MIN
    # negative controls
    assert _chi_square_p_value(samples, (logits / 0.8).softmax(-1)) < P_VALUE_MIN
    wrong_noise = (logits / temperature + torch.rand(draws, vocab, generator=torch.Generator().manual_seed(12),
                                                     dtype=torch.float64)).argmax(-1)
    assert _chi_square_p_value(wrong_noise, exact) < P_VALUE_MIN


def test_same_key_same_token_new_key_new_draw():
    head = _head(2000, seed=13)
    hidden = (torch.randn(1, 128, generator=torch.Generator().manual_seed(14)) * 2).bfloat16()
    temps = torch.full((1,), 1.0)
    first = head.sample(hidden, 2000, temps, torch.tensor([42]))
    assert torch.equal(first, head.sample(hidden, 2000, temps, torch.tensor([42])))
    draws = {int(head.sample(hidden, 2000, temps, torch.tensor([key]))) for key in range(40)}
    assert len(draws) > 3   # a spread distribution: new keys give new tokens


def test_sample_rejects_a_non_positive_temperature():
    head = _head(100, seed=15)
    with pytest.raises(RuntimeError, match="temperature"):
        head.sample(torch.ones(1, 128).bfloat16(), 100, torch.zeros(1), torch.tensor([1]))


def _proposal_reference(head: NativeHead, hidden: torch.Tensor, num_rows: int, selected: int,
                        temperature: torch.Tensor, keys: torch.Tensor, noise_ids: np.ndarray | None,
                        top_k: list[int] | None, top_p: list[float] | None) -> list[int]:
    """Brute force of a proposal: every logit, the `selected` largest (the lower row first on ties), the first top_k of
    them, top-p within those (the mass before a row below top_p), then the Gumbel-max of the rows' ids' noise."""
    logits = head.logits(hidden)[:, :num_rows].double().numpy()
    out = []
    for m in range(logits.shape[0]):
        order = np.lexsort((np.arange(num_rows), -logits[m]))[:selected]
        kept = order[:top_k[m]] if top_k is not None and top_k[m] > 0 else order
        scaled = logits[m][kept] / float(temperature[m])
        if top_p is not None and top_p[m] < 1:
            probs = np.exp(scaled - scaled[0]) / np.exp(scaled - scaled[0]).sum()
            kept = kept[:max(1, int(((np.cumsum(probs) - probs) < top_p[m]).sum()))]
            scaled = scaled[:len(kept)]
        ids = kept if noise_ids is None else noise_ids[kept]
        out.append(int(kept[np.argmax(scaled + _noise(int(keys[m]), ids))]))
    return out


@pytest.mark.parametrize("cut", [{}, {"top_k": [4, 0, 9, 1, 40, 3, 0, 7]}, {"top_p": [0.5, 1.0, 0.9, 0.2] * 2},
                                 {"top_k": [4, 0, 9, 1, 40, 3, 0, 7], "top_p": [0.5, 1.0, 0.9, 0.2] * 2}],
                         ids=["no cut", "top-k", "top-p", "both"])
@pytest.mark.parametrize("mapped", [False, True], ids=["own ids", "other ids"])
def test_a_proposal_is_the_gumbel_max_over_the_largest_logits_the_cut_keeps(cut, mapped):
    """NativeHead.propose (csrc/proposal_head.cpp) against the brute force: the largest logits, the cut, the noise of
    each row's id under its key."""
    head = _head(3000, seed=40, scale=0.1)
    ids = np.random.default_rng(41).choice(150_000, 3000, replace=False) if mapped else None
    hidden = (torch.randn(8, 128, generator=torch.Generator().manual_seed(42)) * 3).bfloat16()
    temps, keys = torch.tensor([0.3, 0.7, 1.0, 2.5] * 2), _keys(8, 43)
    top_k, top_p = cut.get("top_k"), cut.get("top_p")
    proposed = head.propose(hidden, 3000, 32, temps, keys, None if ids is None else torch.from_numpy(ids),
                            None if top_k is None else torch.tensor(top_k), None if top_p is None else torch.tensor(top_p))
    assert proposed.tolist() == _proposal_reference(head, hidden, 3000, 32, temps, keys, ids, top_k, top_p)


def test_an_uncut_proposal_is_the_exact_draw_wherever_that_lies_among_the_selected():
    """Without a cut a proposal is the exact sampling head's draw (the Gumbel-max over every row, same noise) exactly
    where that row is among the selected largest logits, and another row where it is not. Control: a selection of
    one (the draft's greedy token) agrees far less often."""
    head = _head(3000, seed=44, scale=0.1)
    hidden = (torch.randn(400, 128, generator=torch.Generator().manual_seed(45)) * 3).bfloat16()
    temps, keys = torch.full((400,), 0.7), _keys(400, 46)
    exact = head.sample(hidden, 3000, temps, keys)
    proposed = head.propose(hidden, 3000, 32, temps, keys)
    _, selection, _ = head.top(hidden, 3000, 32)
    inside = (selection == exact[:, None]).any(dim=1)
    assert torch.equal(proposed == exact, inside)
    agree = inside.float().mean().item()
    greedy_agree = (head.propose(hidden, 3000, 1, temps, keys) == exact).float().mean().item()
    print(f"\n[proposal] agrees with the exact draw {agree:.3f}; a selection of one {greedy_agree:.3f}")
    assert agree > 0.9 and greedy_agree < agree - 0.1
