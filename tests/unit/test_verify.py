"""verify_greedy (on the argmax of hand-made logits) / verify_sampling (on hand-made probabilities); losslessness
by chi-square."""
from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from anydraft.spec_decode.sampling import draw_noise, sample_from_probs
from anydraft.tensors import greedy_argmax
from anydraft.spec_decode.verify import VerifyOutput, verify_greedy, verify_sampling

P_VALUE_MIN = 1e-3
VOCAB_SIZE = 12


def logits_with_argmax(target_argmax: list[list[int]], vocab_size: int = VOCAB_SIZE) -> torch.Tensor:
    """[B, k+1, V] logits whose argmax at each position is the given target id."""
    argmax = torch.tensor(target_argmax)
    noise = torch.rand(*argmax.shape, vocab_size, generator=torch.Generator().manual_seed(0))
    return noise.scatter(-1, argmax[..., None], 5.0)


def assert_output(out: VerifyOutput, num_accepted: list[int], output_ids: list[list[int]]) -> None:
    assert out.num_accepted.dtype == torch.long and out.output_ids.dtype == torch.long
    assert out.num_accepted.tolist() == num_accepted
    assert out.output_ids.tolist() == output_ids
    assert out.next_ids.tolist() == [row[n] for row, n in zip(output_ids, num_accepted)]


# ---------------------------------------------------------------- greedy

def test_greedy_perfect_match_accepts_all_and_adds_bonus():
    logits = logits_with_argmax([[3, 7, 1, 9]])
    assert_output(verify_greedy(greedy_argmax(logits), torch.tensor([[3, 7, 1]])), [3], [[3, 7, 1, 9]])


def test_greedy_early_mismatch_emits_target_argmax():
    logits = logits_with_argmax([[3, 7, 1, 9]])
    assert_output(verify_greedy(greedy_argmax(logits), torch.tensor([[3, 8, 1]])), [1], [[3, 7, -1, -1]])


def test_greedy_all_rejected_at_position_zero():
    logits = logits_with_argmax([[3, 7, 1, 9]])
    assert_output(verify_greedy(greedy_argmax(logits), torch.tensor([[4, 7, 1]])), [0], [[3, -1, -1, -1]])


def test_greedy_batch_rows_with_different_outcomes():
    logits = logits_with_argmax([[3, 7, 1, 9], [0, 0, 0, 0], [5, 6, 2, 11], [2, 4, 6, 8]])
    drafts = torch.tensor([[3, 7, 1], [0, 1, 0], [6, 6, 2], [2, 4, 5]])
    out = verify_greedy(greedy_argmax(logits), drafts)
    # Row 1 matches again at position 2 after a mismatch: that must not count (prefix only).
    assert_output(out, [3, 1, 0, 2], [[3, 7, 1, 9], [0, 0, -1, -1], [5, -1, -1, -1], [2, 4, 6, -1]])


def test_greedy_no_drafts_emits_argmax():
    out = verify_greedy(greedy_argmax(logits_with_argmax([[4], [10]])), torch.zeros(2, 0, dtype=torch.long))
    assert_output(out, [0, 0], [[4], [10]])


# ---------------------------------------------------------------- sampling, deterministic cases

def test_sampling_with_one_hot_target_equals_greedy():
    """Greedy rows (one-hot p, constant noise from draw_noise) give verify_greedy's answer."""
    logits = logits_with_argmax([[3, 7, 1, 9], [0, 0, 0, 0], [5, 6, 2, 11]])
    drafts = torch.tensor([[3, 7, 1], [0, 1, 0], [6, 6, 2]])
    target_probs = torch.zeros_like(logits).scatter(-1, logits.argmax(-1, keepdim=True), 1.0)
    draft_probs = torch.rand(3, 3, VOCAB_SIZE, generator=torch.Generator().manual_seed(1))
    draft_probs = draft_probs / draft_probs.sum(-1, keepdim=True)  # the draft may even sample
    uniforms, token_uniforms = draw_noise([None, None, None], 3, "cpu")
    out = verify_sampling(target_probs, draft_probs, drafts, uniforms, token_uniforms)
    expected = verify_greedy(greedy_argmax(logits), drafts)
    assert torch.equal(out.output_ids, expected.output_ids)
    assert torch.equal(out.num_accepted, expected.num_accepted)


def _one_position(p: list[float], q: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """target_probs [1, 2, V] (position 1 uniform) and draft_probs [1, 1, V] from one row each."""
    target_probs = torch.tensor([p, [1.0 / len(p)] * len(p)])[None]
    return target_probs, torch.tensor([q])[None]


def test_sampling_acceptance_threshold_is_p_over_q():
    target_probs, draft_probs = _one_position([0.3, 0.7, 0.0, 0.0], [0.6, 0.2, 0.2, 0.0])
    token_uniforms = torch.zeros(1, dtype=torch.float64)
    accepted = verify_sampling(target_probs, draft_probs, torch.tensor([[0]]), torch.tensor([[0.49]]), token_uniforms)
    rejected = verify_sampling(target_probs, draft_probs, torch.tensor([[0]]), torch.tensor([[0.51]]), token_uniforms)
    assert accepted.num_accepted.item() == 1 and accepted.output_ids[0, 0].item() == 0
    assert rejected.num_accepted.item() == 0
    # Residual max(p - q, 0) = [0, 0.5, 0, 0]: the recovered token is 1 whatever the noise.
    assert rejected.next_ids.item() == 1
    assert rejected.output_ids.tolist() == [[1, -1]]


def test_sampling_draft_prob_zero_is_safe():
    target_probs, draft_probs = _one_position([0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0])
    token_uniforms = torch.full((1,), 0.999, dtype=torch.float64)
    accepted = verify_sampling(target_probs, draft_probs, torch.tensor([[1]]), torch.tensor([[0.9]]), token_uniforms)
    assert accepted.num_accepted.item() == 1          # q(x) = 0 < p(x): min(1, p/q) = 1
    rejected = verify_sampling(target_probs, draft_probs, torch.tensor([[3]]), torch.tensor([[0.0]]), token_uniforms)
    assert rejected.num_accepted.item() == 0          # p(x) = q(x) = 0
    assert rejected.next_ids.item() in (0, 1)


def test_sampling_zero_residual_falls_back_to_target():
    # p == q and the drafted token has p = q = 0: residual is all zero, so draw from p.
    target_probs, draft_probs = _one_position([0.5, 0.5, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0])
    token_uniforms = torch.tensor([0.75], dtype=torch.float64)   # past p's first half: token 1
    out = verify_sampling(target_probs, draft_probs, torch.tensor([[2]]), torch.tensor([[0.3]]), token_uniforms)
    assert out.num_accepted.item() == 0 and out.next_ids.item() == 1


def test_sampling_bonus_is_drawn_from_the_last_position():
    target_probs = torch.tensor([[[0.0, 1.0, 0.0], [0.2, 0.3, 0.5]]])
    token_uniforms = torch.tensor([0.1], dtype=torch.float64)  # token 0 (p 0 at position 0, 0.2 at 1)
    out = verify_sampling(target_probs, target_probs[:, :1], torch.tensor([[1]]), torch.tensor([[0.99]]),
                          token_uniforms)
    assert out.output_ids.tolist() == [[1, 0]] and out.num_accepted.tolist() == [1]


# ---------------------------------------------------------------- sampling, distribution (lossless)

NUM_SAMPLES = 40000
TARGET = [[0.10, 0.20, 0.30, 0.15, 0.05, 0.20],
          [0.25, 0.05, 0.10, 0.30, 0.20, 0.10],
          [0.40, 0.00, 0.10, 0.00, 0.30, 0.20]]
DRAFT_CASES = {  # draft distributions q for positions 0 and 1
    "different": [[0.30, 0.10, 0.10, 0.20, 0.20, 0.10], [0.10, 0.30, 0.30, 0.10, 0.10, 0.10]],
    "zero_where_target_positive": [[0.00, 0.50, 0.00, 0.30, 0.20, 0.00], [0.50, 0.00, 0.00, 0.50, 0.00, 0.00]],
    "equal": TARGET[:2],
    "nearly_disjoint": [[0.00, 0.02, 0.00, 0.03, 0.50, 0.45], [0.00, 0.90, 0.00, 0.00, 0.00, 0.10]],
}


def _draw_and_verify(target: list[list[float]], draft: list[list[float]], seed: int,
                     always_accept: bool = False) -> tuple[VerifyOutput, torch.Tensor, torch.Tensor]:
    """NUM_SAMPLES independent rows in one batch: drafts x_i ~ q_i, then verify_sampling."""
    generator = torch.Generator().manual_seed(seed)
    num_drafted = len(draft)
    target_probs = torch.tensor(target).expand(NUM_SAMPLES, -1, -1)
    draft_probs = torch.tensor(draft).expand(NUM_SAMPLES, -1, -1)
    draft_noise = torch.rand(NUM_SAMPLES, num_drafted, generator=generator, dtype=torch.float64)
    draft_target_ids = sample_from_probs(draft_probs, draft_noise)
    uniforms = torch.rand(NUM_SAMPLES, num_drafted, generator=generator)
    if always_accept:
        uniforms = torch.zeros_like(uniforms)
    token_uniforms = torch.rand(NUM_SAMPLES, generator=generator, dtype=torch.float64)
    out = verify_sampling(target_probs, draft_probs, draft_target_ids, uniforms, token_uniforms)
    return out, target_probs, draft_probs


def _chi_square_p_value(samples: torch.Tensor, probs: list[float]) -> float:
    probs_t = torch.tensor(probs, dtype=torch.float64)
    counts = torch.bincount(samples, minlength=probs_t.numel()).double()
    support = probs_t > 0
    assert counts[~support].sum() == 0, "a token with target probability 0 was emitted"
    expected = probs_t[support] / probs_t[support].sum() * samples.numel()
    return float(chisquare(counts[support].numpy(), expected.numpy()).pvalue)


@pytest.mark.parametrize("case", sorted(DRAFT_CASES))
def test_sampling_emitted_tokens_are_distributed_as_target(case: str):
    out, _, _ = _draw_and_verify(TARGET, DRAFT_CASES[case], seed=10)
    assert not (out.output_ids[:, 0] < 0).any()
    # (a) first emitted token ~ p_0, whatever q is.
    assert _chi_square_p_value(out.output_ids[:, 0], TARGET[0]) > P_VALUE_MIN
    # (b) given position 0 accepted, the second emitted token ~ p_1; (c) given both, the bonus ~ p_2.
    for position in (1, 2):
        reached = out.num_accepted >= position
        assert reached.sum() > 1000, "too few samples reach this position for the test to mean anything"
        assert _chi_square_p_value(out.output_ids[reached, position], TARGET[position]) > P_VALUE_MIN
    # Layout: after the emitted token everything is -1.
    positions = torch.arange(3)
    assert ((out.output_ids >= 0) == (positions <= out.num_accepted[:, None])).all()


def test_sampling_acceptance_rate_is_overlap():
    """P(position 0 accepted) = sum_x min(p(x), q(x)), the known rate of rejection sampling."""
    draft = DRAFT_CASES["different"]
    out, _, _ = _draw_and_verify(TARGET, draft, seed=11)
    overlap = torch.minimum(torch.tensor(TARGET[0]), torch.tensor(draft[0])).sum().item()
    rate = (out.num_accepted >= 1).double().mean().item()
    assert abs(rate - overlap) < 4 * (overlap * (1 - overlap) / NUM_SAMPLES) ** 0.5


def test_statistic_detects_always_accept():
    """Negative control: accepting every draft emits q, and the same statistic must notice."""
    out, _, _ = _draw_and_verify(TARGET, DRAFT_CASES["different"], seed=12, always_accept=True)
    assert (out.num_accepted == 2).all()
    assert _chi_square_p_value(out.output_ids[:, 0], TARGET[0]) < P_VALUE_MIN


def test_statistic_detects_recovering_from_target_instead_of_residual():
    """Negative control: on rejection, drawing from p rather than max(p - q, 0) biases the output."""
    out, target_probs, _ = _draw_and_verify(TARGET, DRAFT_CASES["different"], seed=13)
    rejected_at_0 = out.num_accepted == 0
    noise = torch.rand(NUM_SAMPLES, generator=torch.Generator().manual_seed(14), dtype=torch.float64)
    wrong_first = torch.where(rejected_at_0, sample_from_probs(target_probs[:, 0], noise), out.output_ids[:, 0])
    assert _chi_square_p_value(wrong_first, TARGET[0]) < P_VALUE_MIN


# --- ragged proposals: a row verifies only its own number of drafts ------------------------------------------
def test_greedy_ragged_row_stops_at_its_count():
    logits = logits_with_argmax([[3, 7, 1, 9], [3, 7, 1, 9]])
    drafts = torch.tensor([[3, 7, 1], [3, 7, 1]])       # both rows' drafts all match the target
    out = verify_greedy(greedy_argmax(logits), drafts, num_draft_tokens=torch.tensor([3, 1]))
    # row 1 drafted 1 token: it is accepted, then the target's own token after it (7), not the padding drafts
    assert_output(out, [3, 1], [[3, 7, 1, 9], [3, 7, -1, -1]])
    zero = verify_greedy(greedy_argmax(logits), drafts, num_draft_tokens=torch.tensor([0, 2]))
    assert_output(zero, [0, 2], [[3, -1, -1, -1], [3, 7, 1, -1]])


@pytest.mark.parametrize("seed", range(20))
def test_sampling_ragged_row_equals_that_row_verified_alone(seed):
    """A row verified with count n inside a k-draft batch decides exactly what the same row verified with only
    its first n drafts decides, given the same noise: ragged rows are rows that drafted fewer tokens."""
    generator = torch.Generator().manual_seed(seed)
    batch, k = 4, 4
    target_probs = torch.softmax(torch.randn(batch, k + 1, VOCAB_SIZE, generator=generator) * 2, -1)
    draft_probs = torch.softmax(torch.randn(batch, k, VOCAB_SIZE, generator=generator) * 2, -1)
    drafts = torch.multinomial(draft_probs.flatten(0, 1), 1, generator=generator).view(batch, k)
    uniforms = torch.rand(batch, k, generator=generator)
    token_uniforms = torch.rand(batch, generator=generator, dtype=torch.float64)
    counts = torch.tensor([4, 0, 2, 1])
    ragged = verify_sampling(target_probs, draft_probs, drafts, uniforms, token_uniforms, num_draft_tokens=counts)
    for row, n in enumerate(counts.tolist()):
        alone = verify_sampling(target_probs[row:row + 1, :n + 1], draft_probs[row:row + 1, :n],
                                drafts[row:row + 1, :n], uniforms[row:row + 1, :n], token_uniforms[row:row + 1])
        assert ragged.num_accepted[row].item() == alone.num_accepted.item()
        assert ragged.next_ids[row].item() == alone.next_ids.item()
        assert ragged.output_ids[row, :n + 1].tolist() == alone.output_ids[0].tolist()


# --- q over the draft's own columns (TLI, d2t): never scattered into [B, k, V_target] --------------------------
def _columns_case(seed: int, batch: int = 64, k: int = 3, vocab_size: int = 40, num_columns: int = 15):
    """p over the target vocabulary, q over num_columns draft columns mapped injectively into it."""
    generator = torch.Generator().manual_seed(seed)
    target_probs = torch.softmax(torch.randn(batch, k + 1, vocab_size, generator=generator) * 2, -1)
    column_to_target = torch.randperm(vocab_size, generator=generator)[:num_columns]            # [N]
    head_probs = torch.softmax(torch.randn(batch, k, num_columns, generator=generator) * 2, -1)  # [B, k, N]
    columns = sample_from_probs(head_probs, torch.rand(batch, k, generator=generator, dtype=torch.float64))
    dense = torch.zeros(batch, k, vocab_size).scatter_(-1, column_to_target.expand(batch, k, -1), head_probs)
    uniforms = torch.rand(batch, k, generator=generator)
    token_uniforms = torch.rand(batch, generator=generator, dtype=torch.float64)
    return target_probs, head_probs, dense, columns, column_to_target, uniforms, token_uniforms


@pytest.mark.parametrize("seed", range(10))
def test_sampling_draft_columns_decide_as_the_dense_scatter(seed):
    """q over columns + column_to_target gives bit for bit the decisions of q scattered into the target vocabulary
    (same noise, ragged counts included): p - q where q lives, p elsewhere."""
    target_probs, head_probs, dense, columns, column_to_target, uniforms, token_uniforms = _columns_case(seed)
    counts = torch.randint(0, 4, (target_probs.shape[0],), generator=torch.Generator().manual_seed(seed))
    draft_target_ids = column_to_target[columns]
    for num_draft_tokens in (None, counts):
        expected = verify_sampling(target_probs, dense, draft_target_ids, uniforms, token_uniforms, num_draft_tokens)
        out = verify_sampling(target_probs, head_probs, draft_target_ids, uniforms, token_uniforms, num_draft_tokens,
                              draft_columns=columns, column_to_target=column_to_target)
        assert torch.equal(out.num_accepted, expected.num_accepted)
        assert torch.equal(out.output_ids, expected.output_ids)
    # The rows disagree somewhere, so residual draws (where the two layouts differ in memory) took place.
    assert (expected.num_accepted < 3).any() and (expected.num_accepted > 0).any()


def test_sampling_draft_columns_emit_target_distribution_and_control():
    """Chi-square over many rows: the first emitted token follows p_0 with q on 3 of 6 target ids through columns;
    negative control: reading the columns as target ids (a forgotten column_to_target) is detected."""
    num_columns, column_to_target = 3, torch.tensor([5, 1, 3])
    q = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6]])                     # [k=2, N]
    generator = torch.Generator().manual_seed(21)
    target_probs = torch.tensor(TARGET).expand(NUM_SAMPLES, -1, -1)
    head_probs = q.expand(NUM_SAMPLES, -1, -1)
    columns = sample_from_probs(head_probs, torch.rand(NUM_SAMPLES, 2, generator=generator, dtype=torch.float64))
    uniforms = torch.rand(NUM_SAMPLES, 2, generator=generator)
    token_uniforms = torch.rand(NUM_SAMPLES, generator=generator, dtype=torch.float64)
    out = verify_sampling(target_probs, head_probs, column_to_target[columns], uniforms, token_uniforms,
                          draft_columns=columns, column_to_target=column_to_target)
    assert 0 < (out.num_accepted >= 1).double().mean() < 1
    assert _chi_square_p_value(out.output_ids[:, 0], TARGET[0]) > P_VALUE_MIN
    wrong = verify_sampling(target_probs, head_probs, column_to_target[columns], uniforms, token_uniforms,
                            draft_columns=columns, column_to_target=torch.arange(num_columns))
    assert _chi_square_p_value(wrong.output_ids[:, 0], TARGET[0]) < P_VALUE_MIN
