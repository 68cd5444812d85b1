"""Speculation statistics: the one definition of acceptance length (AL) and per-position acceptance.

AL = tokens appended per target verification forward = accepted draft tokens + the one recovered or
bonus token, averaged over target forwards; so 1 <= AL <= k+1 (target alone: AL = 1). Tokens cut off
by a stop condition inside a step still count as appended by that step. A request's first token comes from
the prompt's forward (the prefill), as in vLLM and HF: that forward verifies nothing and is not counted.
Per-position acceptance rate i = P(draft token i accepted) = steps accepting >= i+1 tokens / steps (with adaptive
speculation, steps that drafted fewer than i+1 tokens count as not accepting position i).
k_histogram: how many steps drafted each number of tokens (adaptive speculation chooses it per step).
"""
from __future__ import annotations

from dataclasses import dataclass, field


def acceptance_length(num_accepted: int, verify_forwards: int) -> float:
    """AL, the one definition: tokens appended per verification forward = (accepted draft tokens + the one
    recovered-or-bonus token of each forward) / forwards. A request's prompt forward verifies nothing and is not
    counted. 0.0 when nothing was verified."""
    return (num_accepted + verify_forwards) / verify_forwards if verify_forwards else 0.0


@dataclass
class SpecStats:
    num_speculative_tokens: int = 0
    target_forwards: int = 0          # verification steps (one target forward each)
    num_drafted: int = 0
    num_accepted: int = 0
    num_emitted: int = 0              # tokens returned to the user (after stop truncation)
    accepted_at_position: list[int] = field(default_factory=list)   # [k] count of steps accepting position i
    k_histogram: dict[int, int] = field(default_factory=dict)       # drafted tokens per step -> steps
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    other_seconds: float = 0.0        # bridge / re-sync / verification / bookkeeping
    wall_seconds: float = 0.0

    def __post_init__(self):
        if not self.accepted_at_position:
            self.accepted_at_position = [0] * self.num_speculative_tokens

    def observe_step(self, num_accepted: int, num_drafted: int | None = None) -> None:
        """One target forward verified num_drafted (default k) drafted tokens and accepted num_accepted of them."""
        SpecStats.observe_rows([self], [num_accepted],
                               [self.num_speculative_tokens if num_drafted is None else num_drafted])

    @staticmethod
    def observe_rows(stats: list["SpecStats"], num_accepted: list[int], num_drafted: list[int]) -> None:
        """One target forward for each row: stats[i] verified num_drafted[i] drafted tokens and accepted num_accepted[i]
        of them. A row that accepted none costs no call (a plain step's bookkeeping does not grow by calls per row)."""
        for row_stats, accepted, drafted in zip(stats, num_accepted, num_drafted):
            row_stats.target_forwards += 1
            row_stats.num_drafted += drafted
            row_stats.num_accepted += accepted
            histogram = row_stats.k_histogram
            histogram[drafted] = histogram[drafted] + 1 if drafted in histogram else 1
            if accepted:
                positions = row_stats.accepted_at_position
                for i in range(accepted):
                    positions[i] += 1

    def merge(self, other: "SpecStats") -> None:
        if other.num_speculative_tokens != self.num_speculative_tokens:
            raise ValueError("cannot merge stats of different k")
        self.target_forwards += other.target_forwards
        self.num_drafted += other.num_drafted
        self.num_accepted += other.num_accepted
        self.num_emitted += other.num_emitted
        self.accepted_at_position = [a + b for a, b in zip(self.accepted_at_position, other.accepted_at_position)]
        for k, steps in other.k_histogram.items():
            self.k_histogram[k] = self.k_histogram.get(k, 0) + steps
        for name in ("draft_seconds", "target_seconds", "other_seconds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def acceptance_length(self) -> float:
        return acceptance_length(self.num_accepted, self.target_forwards)

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted / self.num_drafted if self.num_drafted else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / self.target_forwards if self.target_forwards else 0.0 for a in self.accepted_at_position]

    @property
    def tokens_per_second(self) -> float:
        return self.num_emitted / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "acceptance_length": round(self.acceptance_length, 4),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "acceptance_by_position": [round(x, 4) for x in self.acceptance_by_position],
            "num_speculative_tokens": self.num_speculative_tokens,
            "target_forwards": self.target_forwards,
            "num_drafted": self.num_drafted,
            "num_accepted": self.num_accepted,
            "k_histogram": {str(k): n for k, n in sorted(self.k_histogram.items())},
            "num_emitted_tokens": self.num_emitted,
            "tokens_per_second": round(self.tokens_per_second, 3),
            "wall_seconds": round(self.wall_seconds, 4),
            "time_split_seconds": {"draft": round(self.draft_seconds, 4), "target": round(self.target_seconds, 4),
                                   "other": round(self.other_seconds, 4)},
        }

    def summary_line(self) -> str:
        positions = " ".join(f"{x:.2f}" for x in self.acceptance_by_position)
        return (f"AL {self.acceptance_length:.2f} | acceptance by position [{positions}] | "
                f"{self.tokens_per_second:.1f} tok/s | {self.num_emitted} tokens in {self.wall_seconds:.2f}s")
