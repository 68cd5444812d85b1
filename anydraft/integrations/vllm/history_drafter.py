"""HistoryDrafter: anydraft's DraftModelProposer driven by per-row token histories, as vLLM's proposers are.

The contract relied on (vLLM 0.32, V1 model runner, `propose_draft_token_ids` for method "custom_class";
checked on every call, a mismatch raises VLLMContractError):
- `propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)` is called once per step, after the step's
  bookkeeping; row i of the persistent batch is `sampled_token_ids[i]` (list of ints),
  `num_tokens_no_spec[i]` and `token_ids_cpu[i]` (numpy).
- `token_ids_cpu[i, :num_tokens_no_spec[i]]` is row i's whole token history, prompt and output, and already
  ends with `sampled_token_ids[i]`: the tokens this step appended (accepted drafts + the target's own token).
- An empty `sampled_token_ids[i]` means nothing to draft for row i (a prefill chunk, a discarded row).
- The return value is one list of up to k target ids per row; vLLM trims what does not fit.
Nothing else is assumed: which request sits in which row is recovered from histories (request_states.py),
and what the draft cache holds is recovered by comparing new tokens with the last proposals, so a step the
proposer was not called for (vLLM skips it near max_model_len) costs nothing but a re-sync.

Drafting is greedy whatever the request's sampling: vLLM gets no draft distribution from a custom proposer
and verifies the proposals as one-hot, which is exact for any proposal that does not read the target's
random draws.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...config import SpeculativeConfig
from ...spec_decode.draft_proposer import DraftModelProposer
from ...spec_decode.factory import build_proposer
from ...tokenizer import Tokenizer
from ...vocab.token_bytes import incomplete_utf8_tail
from .request_states import RequestStates


class VLLMContractError(RuntimeError):
    """vLLM called the proposer in a way this version of anydraft was not built for."""


@dataclass(frozen=True)
class TargetRecord:
    """The target as the draft side sees it (factory.TargetSide) when another engine runs it."""
    device: torch.device
    dtype: torch.dtype
    vocab_rows: int
    num_token_rows: int


def _contract_error(what: str) -> VLLMContractError:
    return VLLMContractError(f"vLLM's custom_class proposer call differs from the one anydraft supports ({what}); "
                             f"see anydraft/integrations/vllm/history_drafter.py for the contract, vLLM 0.32 for "
                             f"a version that keeps it")


def check_call(sampled_token_ids, num_tokens_no_spec, token_ids_cpu) -> None:
    """Raise VLLMContractError unless the arguments are what the contract above says."""
    if not isinstance(sampled_token_ids, list):
        raise _contract_error(f"sampled_token_ids is a {type(sampled_token_ids).__name__}, not a list of lists")
    if not isinstance(num_tokens_no_spec, np.ndarray) or num_tokens_no_spec.ndim != 1:
        raise _contract_error("num_tokens_no_spec is not a 1-D numpy array")
    if not isinstance(token_ids_cpu, np.ndarray) or token_ids_cpu.ndim != 2:
        raise _contract_error("token_ids_cpu is not a 2-D numpy array")
    if len(sampled_token_ids) > min(len(num_tokens_no_spec), token_ids_cpu.shape[0]):
        raise _contract_error(f"{len(sampled_token_ids)} rows of sampled tokens for {token_ids_cpu.shape[0]} rows")
    for row, sampled in enumerate(sampled_token_ids):
        if not sampled:
            continue
        n = int(num_tokens_no_spec[row])
        tail = token_ids_cpu[row, n - len(sampled):n].tolist() if len(sampled) <= n <= token_ids_cpu.shape[1] else None
        if tail != list(sampled):
            raise _contract_error(f"row {row}: token_ids_cpu[:num_tokens_no_spec] does not end with the sampled tokens")


class HistoryDrafter:
    def __init__(self, draft: DraftModelProposer, target_tokenizer: Tokenizer, num_slots: int, max_model_len: int):
        self.draft = draft
        self.target_tokenizer = target_tokenizer
        self.num_token_rows = target_tokenizer.vocab_size
        self.max_model_len = max_model_len
        self.states = RequestStates(num_slots)
        self._leading_ids = target_tokenizer.encode("")   # what the target tokenizer puts before any text (BOS)
        self._target_bytes = target_tokenizer.token_table.token_bytes

    @classmethod
    def build(cls, spec: SpeculativeConfig, target_tokenizer: Tokenizer, target_vocab_rows: int,
              device: torch.device, dtype: torch.dtype, num_slots: int,
              max_model_len: int) -> tuple["HistoryDrafter", dict]:
        """Load the draft with anydraft's runner, build the bridge; returns (drafter, info) as build_proposer does."""
        target = TargetRecord(torch.device(device), dtype, target_vocab_rows, target_tokenizer.vocab_size)
        draft, info = build_proposer(spec, target, target_tokenizer, num_slots, max_model_len)
        return cls(draft, target_tokenizer, num_slots, max_model_len), info

    @property
    def num_speculative_tokens(self) -> int:
        return self.draft.num_speculative_tokens

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray) -> list[list[int]]:
        """Up to k target ids per row ([] for rows not drafted)."""
        check_call(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        rows, histories = [], []
        for row, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[row])
            if sampled and n < self.max_model_len:
                history = token_ids_cpu[row, :n]
                if int(history.max()) < self.num_token_rows:   # a padding id has no text: leave such a row alone
                    rows.append(row)
                    histories.append(history)
        claims, evicted = self.states.match(rows, histories)
        for slot in evicted:
            self.draft.remove_request(slot)
        drafted: list[tuple[int, int, np.ndarray]] = []          # (slot, row, history)
        accepted, new_target_ids = [], []
        for claim, history in zip(claims, histories):
            if claim.slot is None:
                continue
            if claim.fresh:
                tail = self._start(claim.slot, history)
                num_accepted = 0
            else:
                state = self.states.states[claim.slot]
                tail = history[len(state.history):].tolist()
                num_accepted = _matching_prefix(tail, state.proposal)
            drafted.append((claim.slot, claim.row, history))
            accepted.append(num_accepted)
            new_target_ids.append(tail)
        slots = [slot for slot, _, _ in drafted]
        self.draft.observe(slots, accepted, new_target_ids)
        out: list[list[int]] = [[] for _ in sampled_token_ids]
        if not slots:
            return out
        proposal_batch = self.draft.propose(slots, None)
        proposals = proposal_batch.draft_target_ids.tolist()   # the step's one host sync
        counts = proposal_batch.num_draft_tokens or [len(p) for p in proposals]   # ragged (SLEM): a row's own count
        for (slot, row, history), proposal, count in zip(drafted, proposals, counts):
            self.states.record(slot, history, proposal[:count])
            out[row] = proposal[:count]
        return out

    def _start(self, slot: int, history: np.ndarray) -> list[int]:
        """A new draft state for `history`: its text as a prompt, the draft tokenizer's way, then any trailing
        tokens that end mid-character through re-sync (observe). Returns those trailing tokens (a text without a
        draft token starts from the draft's BOS: DraftResync.new_state)."""
        target_ids = history.tolist()
        split = len(target_ids)
        while split > 0 and incomplete_utf8_tail(self._bytes_of(target_ids[max(0, split - 4):split])):
            split -= 1
        lead = len(self._leading_ids) if target_ids[:len(self._leading_ids)] == self._leading_ids else 0
        text = self.target_tokenizer.decode(target_ids[lead:split], skip_special_tokens=False)
        self.draft.add_request(slot, text, target_ids[:split])
        return target_ids[split:]

    def _bytes_of(self, target_ids: list[int]) -> bytes:
        return b"".join(self._target_bytes[t] or b"" for t in target_ids)


def _matching_prefix(new_target_ids: list[int], proposal: list[int]) -> int:
    """How many of the new tokens equal the last proposals, from the first: exactly the proposals whose draft
    ids the draft cache may hold and can keep (DraftModelProposer.observe checks them again)."""
    n = 0
    while n < min(len(new_target_ids), len(proposal)) and new_target_ids[n] == proposal[n]:
        n += 1
    return n
