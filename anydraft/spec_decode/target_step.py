"""The target's side of a step: the one place that decides greedy vs sampled rows, runs the target over the drafts
and verifies them, returning one VerifyOutput whatever the mix.

A batch with no sampled row is greedy (`sampling_batch` returns None): the target gives argmax ids and verification
compares them. A sampled batch either draws the target's own tokens with the step's noise keys (coupled, where the
target samples natively: the drafts are accepted iff equal) or goes through probabilities and rejection sampling.

Where a row has penalties or a logit bias (spec_decode/penalties.py) the target's logits at every position are
computed and penalized with the counts that position sees (the drafts before it included), and the argmax or the
rejection sampling reads those: never coupled draws, which sample the raw logits.

Where a row asks for logprobs the target's logits at the verified positions are computed (greedy ids then come from
their argmax, the same ids as the argmax-only head's) and the emitted tokens' raw logprobs taken from them
(spec_decode/logprobs.py): no extra forward, and the values are the target's whatever was drafted.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from ..config import SamplingParams
from ..model.runner import ModelRunner, token_places
from ..tensors import greedy_argmax, host_to_device
from .logprobs import TokenLogprobs, pack, token_logprobs, unpack
from .penalties import PenaltyBatch, penalize, penalty_batch
from .proposer import Proposal, Proposer, SamplingBatch
from .sampling import draw_keys, draw_noise, draw_uniforms, logits_to_probs, sample_from_probs
from .truncated_draws import draw_truncated
from .verify import VerifyOutput, verify_greedy, verify_sampling

PROMPT_LOGPROB_POSITIONS = 128   # prompt positions per head pass for prompt logprobs (bounds the logits' memory)


def logprob_width(requests: list) -> int | None:
    """The most top alternatives any of the requests asks for per output token; None when none asks (no call per
    row: a steady decode step asks it of its whole batch)."""
    wanted = [r.params.logprobs for r in requests]
    if wanted.count(None) == len(wanted):
        return None
    return max(n for n in wanted if n is not None)


def host_logprobs(requests: list, packed_rows: list[list[list[float]]], counts: list[int]) -> dict[int, list]:
    """Row index -> the logprob entries of its first counts[i] positions (each row keeps its own top-n), for the
    requests that asked for them. packed_rows[i][j]: position j of row i as `logprobs.pack` laid it out."""
    return {i: [unpack(values, r.params.logprobs) for values in packed_rows[i][:counts[i]]]
            for i, r in enumerate(requests) if r.params.logprobs is not None}


class TargetStep:
    """Target forwards and verification for the engine's steps (no state of its own beyond the models)."""

    def __init__(self, target: ModelRunner, proposer: Proposer):
        self.target, self.proposer = target, proposer

    def first_target_ids(self, requests: list, last_hidden: torch.Tensor) -> tuple[list[int], dict[int, list]]:
        """Each request's first token from the target's hidden state at its last prompt token [A, 1, hidden], and
        the logprob entry of it for those that ask (row index -> [entry]). Host values, in one transfer: a step that
        admits requests syncs here too, since the draft must see that token first."""
        sampling, num_top, penalties = self.sampling_batch(requests), logprob_width(requests), self.penalties(requests)
        wants_logits = num_top is not None or penalties is not None
        logits = self.target.logits(last_hidden) if wants_logits else None                    # [A, 1, V]
        if sampling is None:
            ids = self.target.greedy_ids(last_hidden) if logits is None else greedy_argmax(penalize(logits, penalties))
        elif self.samples_natively(sampling) and penalties is None:
            keys = self.noise_keys(sampling, requests, 1)                                    # [A, 1]
            ids = self.target_draws(last_hidden, sampling, sampling.temperature, keys)
        else:
            logits = self.target.logits(last_hidden) if logits is None else logits
            target_probs = logits_to_probs(penalize(logits, penalties), sampling.temperature, sampling.top_k,
                                           sampling.top_p, sampling.any_greedy)               # [A, 1, V_target]
            uniforms = draw_uniforms(sampling.randoms, 1, target_probs.device)             # [A, 1]
            ids = sample_from_probs(target_probs, uniforms).reshape(-1, 1)
        if num_top is None:
            return ids[:, 0].tolist(), {}
        packed = pack(self.token_logprobs(logits, ids, num_top))                         # [A, 1, 2 + 2n]
        host = torch.cat([ids.double()[:, :, None], packed], dim=-1).tolist()
        return [int(row[0][0]) for row in host], host_logprobs(requests, [[row[0][1:]] for row in host],
                                                                [1] * len(requests))

    def prefill(self, chunks: list[tuple[object, int]]) -> torch.Tensor:
        """Put each chunk of prompt in its row's cache (one right-padded forward) and return the hidden state at
        each chunk's last token [B, 1, hidden]. A request asking for prompt logprobs gets those of the tokens this
        chunk's positions predict (position p: token p + 1; the last prompt position predicts the output instead):
        all such chunks' values come to the host in one transfer."""
        pieces = [r.prefill_target_ids[r.num_prefilled:r.num_prefilled + n] for r, n in chunks]
        scoring = [i for i, (r, _) in enumerate(chunks) if r.prompt_logprobs is not None and not r.resuming]
        if not scoring:
            return self.target.prefill_rows([r.row for r, _ in chunks], pieces, chunk=max(map(len, pieces)))
        width = max(map(len, pieces))
        batch = host_to_device([piece + [0] * (width - len(piece)) for piece in pieces], self.target.device,
                               torch.long)
        hidden = self.target.forward([r.row for r, _ in chunks], batch, num_new=list(map(len, pieces)))   # [B, W, h]
        ends = host_to_device([len(piece) - 1 for piece in pieces], hidden.device, torch.long)
        last_hidden = hidden[torch.arange(len(chunks), device=hidden.device), ends][:, None]
        self._prompt_logprobs([chunks[i][0] for i in scoring], [pieces[i] for i in scoring], hidden[scoring])
        return last_hidden

    def _prompt_logprobs(self, requests: list, pieces: list[list[int]], hidden: torch.Tensor) -> None:
        """hidden [R, W, hidden]: the chunks' states; each request's entries from its chunk's start + 1 on are
        (re)written, so a prompt prefilled again after a preemption gets the same list."""
        starts = [r.num_prefilled for r in requests]
        # Position start + j predicts prompt token start + j + 1, where the prompt has one.
        targets = [r.prompt_target_ids[s + 1:s + len(piece) + 1] for r, s, piece in zip(requests, starts, pieces)]
        places = host_to_device(token_places([len(t) for t in targets], hidden.shape[1]), hidden.device, torch.long)
        ids = host_to_device([t for ts in targets for t in ts], hidden.device, torch.long)
        states = hidden.reshape(-1, hidden.shape[-1])[places]                                  # [M, hidden]
        num_top = max(r.params.prompt_logprobs for r in requests)
        step = PROMPT_LOGPROB_POSITIONS
        packed = [pack(self.token_logprobs(self.target.logits(states[i:i + step]), ids[i:i + step], num_top))
                  for i in range(0, len(ids), step)]
        host = torch.cat(packed).tolist() if packed else []
        at = 0
        for request, start, target in zip(requests, starts, targets):
            entries = [unpack(values, request.params.prompt_logprobs) for values in host[at:at + len(target)]]
            request.prompt_logprobs[start + 1:] = entries
            at += len(target)

    def forward(self, rows: list[int], last_target_ids: list[int], proposal: Proposal,
                sampling: SamplingBatch | None, row_drafts: list[int], logprobs: bool = False,
                penalties: PenaltyBatch | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The target over [last verified token, the row's drafts]: its greedy ids [B, k+1] when every row is greedy
        (the runner need not compute all logits for an argmax); with nothing drafted, its drawn ids [B, 1] where the
        runner samples natively (nor does a draw need them); else its logits [B, k+1, V_target]. A row that drafts
        fewer than k (a probe's other rows, an opted-out or capped request) reads only its own drafts: a one-row
        probe at batch 64 verified 64 x (k+1) tokens for the k of one row. Positions past a row's drafts hold
        nothing that verification reads (ids 0, or the logits of a zero state).
        Also returns the target's logits [B, k+1, V_target] where `logprobs` (some row asks for them; greedy ids then
        are their argmax, the head's argmax rule) or where verification reads them anyway, else None.
        With penalties, the greedy ids or the logits verification reads are the penalized ones (the raw logits are
        returned beside them, for logprobs)."""
        last = host_to_device([[t] for t in last_target_ids], self.target.device, torch.long)
        target_input = torch.cat([last, proposal.draft_target_ids.to(self.target.device)], dim=1)   # [B, k+1]
        width = target_input.shape[1]
        num_new = None if row_drafts.count(width - 1) == len(row_drafts) else [n + 1 for n in row_drafts]
        hidden = self.target.forward(rows, target_input, num_new)                                  # [B, k+1, hidden]
        if penalties is not None:   # every position's logits, penalized (never coupled: see couple)
            logits = self.target.logits(hidden)
            penalized = penalize(logits, penalties, proposal.draft_target_ids)
            return (greedy_argmax(penalized) if sampling is None else penalized), logits
        if sampling is not None and sampling.keys is None:
            logits = self.target.logits(hidden)
            return logits, logits
        if logprobs and sampling is None:
            logits = self.target.logits(hidden)
            return greedy_argmax(logits), logits
        logits = self.target.logits(hidden) if logprobs else None   # coupled draws read none; logprobs do
        read = None
        if num_new is not None:   # only the positions read go through the head, each as its own row
            read = host_to_device(token_places(num_new, width), hidden.device, torch.long)      # [N]
            hidden = hidden.reshape(-1, 1, hidden.shape[-1])[read]                                 # [N, 1, hidden]
        if sampling is None:
            ids = self.target.greedy_ids(hidden)
        else:   # coupled: the target's own draw at every position
            keys, temperature, repeats = sampling.keys[:, :width], sampling.temperature, None
            if read is not None:
                repeats = host_to_device(num_new, hidden.device, torch.long)
                temperature = temperature.repeat_interleave(repeats)
                keys = keys.reshape(-1, 1)[read]                                                   # [N, 1]
            ids = self.target_draws(hidden, sampling, temperature, keys, repeats)
        if read is None:
            return ids, logits                                                                     # [B, k+1]
        out = torch.zeros(len(rows) * width, dtype=ids.dtype, device=ids.device)
        out[read] = ids.reshape(-1)
        return out.reshape(len(rows), width), logits

    def token_logprobs(self, logits: torch.Tensor, token_ids: torch.Tensor, num_top: int) -> TokenLogprobs:
        """The target's raw logprobs of token_ids [...] from its logits [..., V] (one rule for output and prompt)."""
        return token_logprobs(logits, token_ids, num_top, self.target.num_token_rows, self.target.logprob_kernel)

    def emitted_logprobs(self, logits: torch.Tensor, verdict: VerifyOutput, num_top: int) -> torch.Tensor:
        """The raw logprobs of the tokens verification emits at each position (and num_top alternatives), packed
        for the host [B, k+1, 2 + 2 num_top]; positions past a row's emitted tokens hold meaningless values."""
        return pack(self.token_logprobs(logits, verdict.output_ids, num_top))

    def samples_natively(self, sampling: SamplingBatch) -> bool:
        """The target's own draw needs no probabilities: a native sampling head and no greedy row (full-softmax rows,
        or any top-k / top-p cuts: truncated_draws); else the PyTorch path: logits, logits_to_probs,
        sample_from_probs."""
        return self.target.samples_natively and not sampling.any_greedy

    def target_draws(self, hidden: torch.Tensor,   # [B, S, hidden]
                      sampling: SamplingBatch, temperature: torch.Tensor, keys: torch.Tensor,   # [B], [B, S]
                      repeats: torch.Tensor | None = None,   # [rows]: row i's settings serve repeats[i] of the B
                      ) -> torch.Tensor:                     # [B, S] the target's own draws
        """The target's draws with the step's keys: from the full softmax, or through each row's top-k / top-p cut."""
        if sampling.untruncated:
            return self.target.sample_ids(hidden, temperature, keys)
        top_k, top_p = sampling.top_k, sampling.top_p
        if repeats is not None:
            top_k = None if top_k is None else top_k.repeat_interleave(repeats)
            top_p = None if top_p is None else top_p.repeat_interleave(repeats)
        return draw_truncated(self.target, hidden, temperature, keys, top_k, top_p, sampling.top_k_max)

    def couple(self, sampling: SamplingBatch | None, k: int, requests: list,
               penalties: PenaltyBatch | None = None) -> SamplingBatch | None:
        """Coupled draws where both sides can (a native sampling head on the target, a proposer that draws with the
        same noise, or nothing drafted): the target draws its own token at each of the k+1 positions (Gumbel-max,
        the noise of a row's output position n from its key n, `draw_keys`) and a draft is accepted iff it equals the
        target's draw there. Lossless: the emitted tokens are the target's own draws, and the step stops at a position
        from earlier positions' noise only, so a position's key is still unseen when the next step draws it again
        after its true prefix. Each emitted token is then argmax(logits / T + noise of key n) after the same prefix
        as the target alone's: a seeded request samples its text token for token, whatever k and batch.
        No probabilities on either side (a top-k / top-p cut reads the head's largest or all logits: truncated_draws).
        Else (greedy rows, penalties, other heads or proposers) rejection sampling, whose seeded output depends on
        the drafts."""
        if sampling is None or not self.samples_natively(sampling) or penalties is not None:
            return sampling
        if k and not getattr(self.proposer, "couples_draws", False):
            return sampling
        return replace(sampling, keys=self.noise_keys(sampling, requests, k + 1))                  # [B, k+1]

    def noise_keys(self, sampling: SamplingBatch, requests: list, num: int) -> torch.Tensor:   # [B, num]
        """Each request's noise keys for its next `num` output positions (sampling.draw_keys)."""
        positions = [len(r.output_target_ids) for r in requests]
        return draw_keys(sampling.randoms, positions, num, self.target.device)

    def verify(self, target_out, proposal: Proposal, sampling: SamplingBatch | None,
                row_drafts: list[int]) -> VerifyOutput:
        k = proposal.draft_target_ids.shape[1]
        # Ragged only when some request drafts fewer than the step's k (it opted out of speculation or capped it).
        num_draft_tokens = (None if row_drafts.count(k) == len(row_drafts)
                            else host_to_device(row_drafts, target_out.device, torch.long))        # [B]
        if sampling is None or not target_out.is_floating_point():   # ids: greedy, or drawn with nothing to verify
            return verify_greedy(target_out, proposal.draft_target_ids, num_draft_tokens)
        target_probs = logits_to_probs(target_out, sampling.temperature, sampling.top_k, sampling.top_p,
                                       sampling.any_greedy)                                 # [B, k+1, V_target]
        # Drawn where the row generators live (host), moved in one non-blocking copy each.
        uniforms, token_uniforms = draw_noise(sampling.randoms, k, target_probs.device)    # [B, k], [B]
        return verify_sampling(target_probs, proposal.draft_probs.to(target_probs), proposal.draft_target_ids,
                               uniforms.to(target_probs.dtype), token_uniforms, num_draft_tokens,
                               proposal.draft_columns, proposal.column_to_target)

    def penalties(self, requests: list) -> PenaltyBatch | None:
        """The penalties and logit biases of the requests, or None when none has any (checked in constant calls)."""
        if not SamplingParams.any_penalized([r.params for r in requests]):
            return None
        return penalty_batch(requests, self.target.head_rows, self.target.device)

    def sampling_batch(self, requests: list) -> SamplingBatch | None:
        params = [r.params for r in requests]
        if SamplingParams.all_greedy(params):
            return None
        dev = self.target.device
        # None when no row truncates: logits_to_probs then skips its sort over the vocabulary (the costliest
        # part of a sampling step on a 150k vocabulary).
        use_top_k = any(p.top_k > 0 for p in params)
        use_top_p = any(p.top_p < 1.0 for p in params)
        return SamplingBatch(
            temperature=host_to_device([p.temperature for p in params], dev),
            top_k=host_to_device([max(p.top_k, 0) for p in params], dev, torch.long) if use_top_k else None,
            top_p=host_to_device([p.top_p for p in params], dev) if use_top_p else None,
            randoms=[None if r.params.greedy else r.random for r in requests],   # greedy rows draw no noise
            top_k_max=max(p.top_k for p in params) if use_top_k and min(p.top_k for p in params) > 0 else 0)
