"""The engine: requests, cache rows (slots), and the speculative step loop."""
from __future__ import annotations

import itertools
import time

import torch

from .config import SamplingParams
from .metrics import SpecStats
from .model.runner import ModelRunner
from .output_processor import OutputProcessor
from .request import Request
from .scheduler import Scheduler
from .spec_decode.policy import AdaptiveK, BatchView, FixedK, SpeculationPolicy, StepRecord
from .spec_decode.proposer import Proposal, Proposer, draft_runner
from .spec_decode.sampling import RowRandom
from .spec_decode.target_step import TargetStep, host_logprobs, logprob_width
from .spec_decode.verify import VerifyOutput
from .tokenizer import Tokenizer

# Target tokens per step (decoding rows' k+1 each, the rest prompt chunks) unless the caller says otherwise.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048   # as vLLM: a long prompt goes in 2048-token chunks


class Engine:
    """Continuous batching over a fixed set of cache rows: requests join and leave between steps.

    Three parts: the scheduler (rows, waiting queue, the per-step token budget), the step (prefill chunks,
    then propose -> verify -> rewind -> observe), and the output processor (finish reasons, text).
    """

    def __init__(self, target: ModelRunner, tokenizer: Tokenizer, proposer: Proposer, max_model_len: int,
                 max_num_batched_tokens: int | None = None, adaptive: bool = False, prefix_caching: bool = True):
        self.target, self.tokenizer, self.proposer = target, tokenizer, proposer
        self.target_step = TargetStep(target, proposer)   # greedy vs sampled rows, target forward, verification
        self.k = proposer.num_speculative_tokens   # the most tokens a step drafts
        # How many of them each step drafts: adaptive picks 0..k for the most expected tokens per second.
        self.policy: SpeculationPolicy = (AdaptiveK(self.k, proposer.draft_forwards) if adaptive and self.k
                                          else FixedK(self.k))
        # Prompt + output tokens per request. The target cache holds all but the last of them plus the k+1 of a
        # verification forward, so it needs max_model_len + k entries (LLM allocates that): then speculative
        # and target-alone decoding stop at the same length.
        self.max_model_len = min(max_model_len, target.cache.max_len - self.k)
        max_num_seqs = target.cache.max_batch
        if max_num_batched_tokens is None:
            max_num_batched_tokens = max(DEFAULT_MAX_NUM_BATCHED_TOKENS, 2 * max_num_seqs * (self.k + 1))
        # A hidden-state drafter reads the target's states at every prompt position: a prefix hit would skip them.
        target.cache.prefix_caching = prefix_caching and target.capture_layers is None
        self.scheduler = Scheduler(max_num_seqs, max_num_batched_tokens, self.k + 1, target.cache)
        self.output = OutputProcessor(tokenizer, self.max_model_len)
        self.last_target_id: dict[int, int] = {}         # row -> the one token not yet in the target cache
        self.stats = SpecStats(self.k)
        self._next_id = itertools.count()

    @property
    def running(self) -> dict[int, Request]:
        return self.scheduler.running

    @property
    def free_rows(self) -> list[int]:
        return self.scheduler.free_rows

    # -- requests -------------------------------------------------------------------------------------------
    def new_request(self, prompt: str | None, params: SamplingParams, prompt_target_ids: list[int] | None = None
                    ) -> Request:
        """A validated request, not yet queued (safe to call from another thread than the one stepping). A prompt
        as text, or as target token ids (then its text, which the draft reads, is their decoding)."""
        if prompt_target_ids is None:
            prompt_target_ids = self.tokenizer.encode(prompt or "")
        elif prompt is None:
            bad = [i for i in prompt_target_ids if not 0 <= i < self.tokenizer.vocab_size]
            if bad:
                raise ValueError(f"prompt_token_ids has ids outside the target vocabulary "
                                 f"[0, {self.tokenizer.vocab_size}): {bad[:5]}")
            prompt = self.tokenizer.decode(prompt_target_ids)
        if not prompt_target_ids:
            raise ValueError("prompt is empty; give at least one token of text")
        outside = [i for i in params.logit_bias or {} if i >= self.tokenizer.vocab_size]
        if outside:
            raise ValueError(f"logit_bias has ids outside the target vocabulary [0, {self.tokenizer.vocab_size}): "
                             f"{outside[:5]}")
        refusal = getattr(self.proposer, "sampling_refusal", None)
        if refusal and not params.greedy:
            raise ValueError(refusal)
        if len(prompt_target_ids) >= self.max_model_len:
            raise ValueError(f"prompt has {len(prompt_target_ids)} tokens, too long for max_model_len "
                             f"{self.max_model_len} (prompt and output together); raise max_model_len or shorten "
                             f"the prompt")
        return Request(next(self._next_id), prompt, prompt_target_ids, params, RowRandom(params.seed),
                       SpecStats(self.k), self.output.start(params, len(prompt_target_ids)),
                       output_budget=min(params.max_tokens, self.max_model_len - len(prompt_target_ids)))

    def add_request(self, prompt: str | None, params: SamplingParams,
                    prompt_target_ids: list[int] | None = None) -> Request:
        request = self.new_request(prompt, params, prompt_target_ids)
        self.scheduler.add(request)
        return request

    def submit(self, request: Request) -> None:
        """Queue a request made by new_request."""
        self.scheduler.add(request)

    def abort(self, request: Request) -> None:
        """Drop a request (e.g. its client disconnected) and free its row."""
        request.finish_reason = request.finish_reason or "abort"
        if self.scheduler.remove(request):
            self._reset_row(request.row)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def kv_pools(self) -> dict:
        """The block pools to report: the target's, and the draft's where it has a KV cache of its own."""
        runner = draft_runner(self.proposer)
        return {"target": self.target.cache.pool, **({"draft": runner.cache.pool} if runner is not None else {})}

    def load_summary(self) -> str:
        """One line for the periodic log: requests, pool usage, prefix hit rates, preemptions."""
        parts = [f"running {len(self.scheduler.running)}, waiting {len(self.scheduler.waiting)}"]
        for name, pool in self.kv_pools().items():
            stats = pool.stats
            rate = stats.hit_tokens / stats.queried_tokens if stats.queried_tokens else 0.0
            parts.append(f"{name} KV cache {pool.usage():.1%} used, prefix hit rate {rate:.1%}")
        parts.append(f"preemptions {self.scheduler.num_preemptions}")
        return "; ".join(parts)

    # -- the step ----------------------------------------------------------------------------------------------
    def step(self) -> list[Request]:
        """Prompt chunks of joining requests, then one speculative step over the decoding rows; returns the
        requests that got output in it (finished ones included)."""
        start = time.perf_counter()
        scheduled = self.scheduler.schedule()
        for _, row in scheduled.preempted:   # their target blocks are free already; the draft's go now
            self._reset_row(row)
        t0 = time.perf_counter()
        scheduling_seconds = t0 - start
        updated = self._prefill(scheduled.prefill, scheduled.completing) if scheduled.prefill else []
        prefill_seconds = time.perf_counter() - t0   # target work that every request of the step waited through
        for stats in [self.stats] + [r.stats for r, _ in scheduled.prefill] + [r.stats for r in scheduled.decode]:
            stats.target_seconds += prefill_seconds
        if scheduled.decode:
            updated += self._speculate(scheduled.decode, scheduling_seconds)
        return updated

    def _prefill(self, chunks: list[tuple[Request, int]], completing: list[bool]) -> list[Request]:
        """Put each chunk in its row's target cache (one right-padded forward). A request whose prompt this
        completes (`completing`, the scheduler's word) gets its first token from the hidden state at its last prompt
        token, as in vLLM and HF (no verification step is spent on it), and joins the proposer; a resumed one
        (preempted earlier) decodes on from its last token."""
        for request, _ in chunks:
            request.started = request.started or time.perf_counter()
        last_hidden = self.target_step.prefill(chunks)   # and the prompt logprobs of requests asking for them
        for request, n in chunks:
            request.num_prefilled += n
            self.scheduler.publish(request)
        complete = [i for i, done in enumerate(completing) if done]
        fresh = [i for i in complete if not chunks[i][0].resuming]
        admitted = [chunks[i][0] for i in fresh]
        if admitted:
            first_target_ids, logprobs = self.target_step.first_target_ids(admitted, last_hidden[fresh])
            now = time.perf_counter()
            for request, target_id in zip(admitted, first_target_ids):
                request.first_token_at = now
                self.last_target_id[request.row] = target_id
            self._emit(admitted, [[target_id] for target_id in first_target_ids], logprobs)
        joined = [chunks[i][0] for i in complete if not chunks[i][0].finished]
        for request in joined:
            if request.resuming:   # the draft reads the same text again: prompt and all output but the last token
                self.last_target_id[request.row] = request.output_target_ids[-1]
                text = request.prompt + self.tokenizer.decode(request.output_target_ids[:-1])
                self.proposer.add_request(request.row, text, request.resume_target_ids)
            else:
                self.proposer.add_request(request.row, request.prompt, request.prompt_target_ids)
        self.proposer.observe([r.row for r in joined], [0] * len(joined),
                              [[self.last_target_id[r.row]] for r in joined])
        return admitted

    def _release(self, request: Request) -> None:
        self.scheduler.publish(request)
        self.scheduler.remove(request)
        self._reset_row(request.row)
        request.stats.wall_seconds = time.perf_counter() - request.started

    def _reset_row(self, row: int) -> None:
        self.last_target_id.pop(row, None)
        self.target.cache.reset(row)
        self.proposer.remove_request(row)

    def _speculate(self, step_requests: list[Request], scheduling_seconds: float = 0.0) -> list[Request]:
        """One speculative step over the decoding rows; returns them (each got at least one token). The policy is
        told the step's host time whole: before the plan (scheduling, the batch view, planning) and after the
        target forward, since a step's fixed host cost is what drafting several tokens a step saves."""
        rows = [r.row for r in step_requests]
        t0 = time.perf_counter()
        sampling = self.target_step.sampling_batch(step_requests)
        sampled = None if sampling is None else sampling.sampled                          # [B], None: all greedy
        batch = self._batch_view(step_requests, rows, sampled)
        k = self.policy.plan(batch).k                                                     # 0 = plain decode
        t_planned = time.perf_counter()   # the draft is timed from here; planning counts as host time
        penalties = self.target_step.penalties(step_requests)                             # None: no row has any
        sampling = self.target_step.couple(sampling, k, step_requests, penalties)         # noise keys, or as is
        target_states = self.target.take_hidden_states()   # what a hidden-state draft reads ([] for others)
        proposal = self.proposer.propose(rows, sampling, k, target_states)                # [B, k] target ids
        row_drafts = self._row_drafts(step_requests, proposal)                            # per row, may cap
        t1 = time.perf_counter()
        num_top = logprob_width(step_requests)                          # None: no row asks for logprobs
        target_out, logits = self.target_step.forward(rows, [self.last_target_id[r] for r in rows], proposal,
                                                      sampling, row_drafts, num_top is not None, penalties)
        t2 = time.perf_counter()
        verdict = self.target_step.verify(target_out, proposal, sampling, row_drafts)
        packed = None if num_top is None else self.target_step.emitted_logprobs(logits, verdict, num_top)
        num_accepted, new_target_ids, logprobs = self._fetch_to_host(verdict, step_requests, packed)   # one sync
        self.target.cache.rewind(rows, [drafted - n for drafted, n in zip(row_drafts, num_accepted)])
        self.proposer.observe(rows, num_accepted, new_target_ids)
        self._record(step_requests, row_drafts, num_accepted, new_target_ids, logprobs)
        t3 = time.perf_counter()
        self.policy.observe(StepRecord(
            batch, k, row_drafts, num_accepted, sampled,
            draft_seconds=t1 - t_planned, later_draft_seconds=self.proposer.later_draft_seconds if k else 0.0,
            target_seconds=t2 - t1, host_seconds=t3 - t2 + scheduling_seconds + t_planned - t0,
            read_tokens=batch.unread_tokens if k else 0))
        # Every request of the step waited through all of it: each gets the step's split, and so does the total.
        for stats in [self.stats] + [r.stats for r in step_requests]:
            stats.draft_seconds += t1 - t0
            stats.target_seconds += t2 - t1
            stats.other_seconds += t3 - t2
        return step_requests

    def _batch_view(self, requests: list[Request], rows: list[int], sampled: list[bool] | None) -> BatchView:
        """What the policy sees of the step: rows, sampled rows, the text the draft has yet to read and (only where
        there is some: it is spread over them) the tokens the rows may still write, within max_model_len."""
        num_sampled = 0 if sampled is None else sampled.count(True)
        unread = self.proposer.unread_tokens(rows) if self.k else 0
        if not unread:
            return BatchView(len(rows), num_sampled)
        left = 0
        for r in requests:   # no call per row (tests/engine/test_host_calls.py)
            left += r.output_budget - r.stats.num_emitted
        return BatchView(len(rows), num_sampled, unread, left / len(rows))

    @staticmethod
    def _row_drafts(requests: list[Request], proposal: Proposal) -> list[int]:
        """Draft tokens each row verifies: what it proposed (the proposal's width, k or fewer where every row proposes
        fewer, or its own count), capped by its request's num_speculative_tokens."""
        width = proposal.draft_target_ids.shape[1]
        counts = proposal.num_draft_tokens or [width] * len(requests)
        caps = [r.params.num_speculative_tokens for r in requests]
        if not width or caps.count(None) == len(caps):
            return list(counts)
        return [n if cap is None or cap >= n else cap for n, cap in zip(counts, caps)]

    @staticmethod
    def _fetch_to_host(verdict: VerifyOutput, requests: list[Request], logprobs: torch.Tensor | None = None
                       ) -> tuple[list[int], list[list[int]], dict[int, list] | None]:
        """The step's single host-device sync: accepted counts and emitted target ids, in one transfer, with the
        emitted tokens' logprobs ([B, k+1, P] packed, where some row asks) in the same one (all as float64: exact
        for ids and float32 values); row index -> its entries for the requests that asked."""
        if logprobs is None:
            packed = torch.cat([verdict.num_accepted[:, None], verdict.output_ids], dim=1).tolist()
            num_accepted = [row[0] for row in packed]
            return num_accepted, [row[1:2 + n] for row, n in zip(packed, num_accepted)], None
        width = verdict.output_ids.shape[1]
        host = torch.cat([verdict.num_accepted[:, None].double(), verdict.output_ids.double(),
                          logprobs.flatten(1)], dim=1).tolist()
        num_accepted = [int(row[0]) for row in host]
        new_target_ids = [[int(t) for t in row[1:2 + n]] for row, n in zip(host, num_accepted)]
        size = logprobs.shape[-1]
        positions = [[row[1 + width + j * size:1 + width + (j + 1) * size] for j in range(n + 1)]
                     for row, n in zip(host, num_accepted)]
        return num_accepted, new_target_ids, host_logprobs(requests, positions, [n + 1 for n in num_accepted])

    # -- bookkeeping -------------------------------------------------------------------------------------------
    def _record(self, step_requests: list[Request], row_drafts: list[int], num_accepted: list[int],
                new_target_ids: list[list[int]], logprobs: dict[int, list] | None = None) -> None:
        """The step's verdict to each request's stats and output: a constant number of calls a step (none per row)
        where no row ends, meets EOS or has stop strings (tests/engine/test_host_calls.py)."""
        SpecStats.observe_rows([r.stats for r in step_requests] + [self.stats] * len(step_requests),
                               num_accepted * 2, row_drafts * 2)
        last_target_id = self.last_target_id
        for request, target_ids in zip(step_requests, new_target_ids):
            last_target_id[request.row] = target_ids[-1]
        self._emit(step_requests, new_target_ids, logprobs)

    def _emit(self, requests: list[Request], new_target_ids: list[list[int]], logprobs: dict | None = None) -> None:
        """Give each request its new tokens and logprob entries (the output processor cuts them where the request
        ends: EOS, length, stop string) and release the rows that ended."""
        num_emitted, ended = self.output.extend_rows(requests, new_target_ids, logprobs)
        for request, n in zip(requests, num_emitted):
            request.stats.num_emitted += n
        self.stats.num_emitted += sum(num_emitted)
        for request in ended:
            self._release(request)

    def run(self, progress=None) -> None:
        """Step until every request has finished."""
        start = time.perf_counter()
        while self.has_unfinished():
            done = [r for r in self.step() if r.finished]
            if progress is not None and done:
                progress(len(done))
        self.stats.wall_seconds += time.perf_counter() - start
