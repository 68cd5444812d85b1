"""What distillation minimises: the distance between the draft's proposal distribution and the target's next-token
distribution over the tokens the draft can propose (pure tensor functions, testable on hand-made logits).

At a position where the target and draft tokenizations share a boundary, TLI's draft proposes a token of the
intersection I with probability q(x) = softmax(draft logits over I / T), and rejection sampling accepts it with
min(1, p(x) / q(x)), where p is the target's softmax over its whole vocabulary at the same T. The chance a position
is accepted is sum_{x in I} min(p(x), q(x)) = 1 - TV(p, q): the bound the loss `tv` raises directly. `kl` is the
forward KL from p restricted to I (renormalized) to q, `jsd` the Jensen-Shannon divergence between them.
"""
from __future__ import annotations

import torch

LOSSES = ("tv", "kl", "jsd")


def target_probs_on(target_logits: torch.Tensor,    # [M, V_target_rows]
                    columns: torch.Tensor,          # [N] target ids of the intersection, in the draft's order
                    temperature: float,
                    num_token_rows: int) -> torch.Tensor:   # [M, N]
    """p at the intersection's target ids: the softmax over every token row (padding rows excluded), gathered."""
    logits = target_logits[:, :num_token_rows].float() / temperature
    return torch.softmax(logits, dim=-1)[:, columns]


def proposal_log_probs(draft_logits: torch.Tensor,   # [M, N] the draft's logits at the intersection's draft ids
                       temperature: float) -> torch.Tensor:   # [M, N]
    """log q: the draft's proposal distribution, restricted to the intersection and renormalized."""
    return torch.log_softmax(draft_logits.float() / temperature, dim=-1)


def acceptance(target_probs: torch.Tensor, proposal_log_probs_: torch.Tensor) -> torch.Tensor:   # [M]
    """sum_x min(p(x), q(x)) per position: the chance rejection sampling accepts the draft's proposal (1 - TV)."""
    return torch.minimum(target_probs, proposal_log_probs_.exp()).sum(dim=-1)


def one_hot_acceptance(target_probs: torch.Tensor, proposal_log_probs_: torch.Tensor) -> torch.Tensor:   # [M]
    """p(argmax q) per position: the chance a greedily drafted token is accepted when the verifier treats it as a
    one-hot proposal (q = 1 at the token), which is how vLLM verifies a custom_class proposer's tokens."""
    return target_probs.gather(-1, proposal_log_probs_.argmax(dim=-1, keepdim=True)).squeeze(-1)


def distillation_loss(target_probs: torch.Tensor,          # [M, N]
                      proposal_log_probs_: torch.Tensor,   # [M, N]
                      kind: str) -> torch.Tensor:          # scalar
    if kind == "tv":
        return 1.0 - acceptance(target_probs, proposal_log_probs_).mean()
    within = target_probs / target_probs.sum(dim=-1, keepdim=True).clamp_min(1e-12)   # p restricted to I
    log_within = torch.log(within.clamp_min(1e-30))
    if kind == "kl":
        return (within * (log_within - proposal_log_probs_)).sum(dim=-1).mean()
    if kind == "jsd":
        q = proposal_log_probs_.exp()
        log_mean = torch.log((0.5 * (within + q)).clamp_min(1e-30))
        return 0.5 * ((within * (log_within - log_mean)).sum(-1) + (q * (proposal_log_probs_ - log_mean)).sum(-1)).mean()
    raise ValueError(f"loss must be one of {', '.join(LOSSES)}, got {kind!r}")
