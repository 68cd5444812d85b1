"""DraftModelProposer: a draft model that writes k tokens per row, whatever its vocabulary (see draft_vocab)."""
from __future__ import annotations

import time

import torch

from ..model.captured_states import CapturedStates
from ..model.runner import ModelRunner
from ..tensors import host_to_device
from .draft_vocab import DraftVocab
from .proposer import Proposal, SamplingBatch, empty_proposal
from .sampling import draw_uniforms, logits_to_probs, sample_from_probs
from .truncated_draws import propose_coupled

FULL_ROW_PROPOSAL = 0  # target id proposed by a row whose draft cache is full (any id would do: it is verified)


class DraftModelProposer:
    """Keeps, per row, the draft's token sequence (host) and its KV cache (device).

    Invariant between steps: the draft cache holds a prefix of `state.draft_ids`; the rest (>= 1 token)
    is fed at the start of the next `propose`.
    """

    def __init__(self, runner: ModelRunner, vocab: DraftVocab, num_speculative_tokens: int):
        self.runner = runner
        self.vocab = vocab
        self.num_speculative_tokens = num_speculative_tokens
        self.num_proposed = 0   # k of the last propose: what the draft cache holds beyond draft_ids (observe)
        self.later_draft_seconds = 0.0   # the last proposal's forwards after its first (Proposer)
        self.states: dict[int, object] = {}
        # Rows added and not drafted for yet (prompt not in the cache) -> the prompt's target tokens; and their sum,
        # kept as rows come and go: adaptive asks for it on every step (unread_tokens), with the same rows most of the
        # time.
        self.unread_prompts: dict[int, int] = {}
        self.unread_prompt_tokens = 0
        # Rows whose prompt the draft has not tokenized yet -> its text and target ids: the draft tokenizes it at the
        # row's first draft (start_rows), so a joining request's first token waits on nothing of the draft's, and a
        # row adaptive never drafts for (a full batch) costs the draft nothing.
        self.untokenized: dict[int, tuple[str, list[int]]] = {}
        # Text appended to rows the last propose did not draft for (all rows after a plain step, all but one after a
        # probe), one {row: new_target_ids} per observe: a row reads its part when it next drafts, in one re-sync
        # call, so a plain target step costs one dict here (no re-sync), and a one-row probe reads one row's text,
        # not the batch's. backlog[0] is entry number backlog_base; a row has read the entries before
        # backlog_start[row].
        self.backlog: list[dict[int, list[int]]] = []
        self.backlog_base = 0
        self.backlog_start: dict[int, int] = {}
        self.drafted_rows: frozenset[int] = frozenset()   # the rows the last propose drafted for
        self.device = runner.device

    def add_request(self, row: int, prompt_text: str, prompt_target_ids: list[int]) -> None:
        self.remove_request(row)   # a row re-added: its new prompt only
        self.untokenized[row] = (prompt_text, prompt_target_ids)
        self.unread_prompts[row] = len(prompt_target_ids)
        self.unread_prompt_tokens += len(prompt_target_ids)
        self.backlog_start[row] = self.backlog_base + len(self.backlog)   # a reused row's old entries are not its

    def remove_request(self, row: int) -> None:
        state = self.states.pop(row, None)
        if state is not None:   # its cache holds a prefix of its draft ids: later prompts may reuse it
            self.runner.cache.publish(row, state.draft_ids)
        if row in self.drafted_rows:   # its drafts left with it: a request re-added there reads from the backlog
            self.drafted_rows = self.drafted_rows - {row}
        self.untokenized.pop(row, None)
        self.backlog_start.pop(row, None)   # a request reusing the row starts after the entries there now
        self._drop_read_backlog()
        self.unread_prompt_tokens -= self.unread_prompts.pop(row, 0)
        self.runner.cache.reset(row)

    def start_rows(self, rows: list[int]) -> None:
        """Tokenize the prompts of `rows` not tokenized yet (their state: the draft's sequence of the text)."""
        for row in rows:
            if (prompt := self.untokenized.pop(row, None)) is not None:
                self.states[row] = self.vocab.sync.start(*prompt)

    def _pending_ids(self, rows: list[int], draft_id_lists: list[list[int]]) -> list[list[int]]:
        """Each row's draft ids past its cache: what the next forward feeds."""
        lengths = self.runner.cache.lengths
        pending = [draft_ids[lengths[row]:] for row, draft_ids in zip(rows, draft_id_lists)]
        if [] in pending:
            # Re-sync may leave nothing new (bytes still pending); re-feed the last token to get its logits.
            last = [len(ids) - 1 if not new else lengths[row] for row, ids, new in zip(rows, draft_id_lists, pending)]
            self.runner.cache.keep_at_most(rows, last)
            pending = [draft_ids[lengths[row]:] for row, draft_ids in zip(rows, draft_id_lists)]
        return pending

    @property
    def couples_draws(self) -> bool:
        """Whether _draft can draw with the step's noise keys (a native sampling head), the target's noise per
        target id: then a draft equals the target's own draw as often as Gumbel coupling allows."""
        return self.runner.samples_natively

    def draft_forwards(self, num_tokens: int) -> int:
        """The pending tokens and the first draft in one forward, then one per further draft."""
        return num_tokens

    def unread_tokens(self, rows: list[int]) -> int:
        """The prompts of rows that have not drafted yet, in target tokens (the draft's own count needs its tokenizer,
        which runs only when it drafts; read costs are measured per target token too). Not the backlog of plain steps:
        a run that alternates plain and drafting steps reads one every time it drafts, a recurring cost that the
        draft forwards' own measured times carry (priced as a one-off read, it made drafting after plain steps look
        cheap, and adaptive drafted at batch 64 where the target alone was faster)."""
        unread = self.unread_prompts
        if not unread:
            return 0
        if len(rows) == len(self.states) + len(self.untokenized):   # every live row (a step's rows: live, each once)
            return self.unread_prompt_tokens
        return sum(unread[r] for r in rows if r in unread)

    def propose(self, rows: list[int], sampling: SamplingBatch | None, num_tokens: int | None = None,
                target_states: list[CapturedStates] | None = None) -> Proposal:
        k = self.num_speculative_tokens if num_tokens is None else num_tokens
        runner, self.num_proposed = self.runner, k
        self.drafted_rows = frozenset(rows if k else ())
        if k == 0:   # a plain target step: nothing to write; the draft catches up on the text at its next propose
            return empty_proposal(len(rows), self.vocab.target_vocab_rows, sampling is not None, self.device)
        unread = self.unread_prompts   # rows not drafting now keep waiting (a probe)
        joined = [r for r in rows if r in unread] if unread else []
        self.later_draft_seconds = 0.0   # set by _draft (not called where every row's draft cache is full)
        self.start_rows(joined)
        self._read_backlog(rows)
        # Another tokenizer may spell the text in many more tokens than the target's, so a row's draft sequence
        # can outgrow the draft cache. Such a row stops drafting: it proposes a fixed token (q one-hot on it),
        # which verification handles like any proposal, so the output stays the target's. (A row's cached and
        # pending tokens are its draft ids: it has room for k - 1 more past them, or not.)
        longest_drafting = runner.cache.max_len - k + 1
        # A row whose blocks the pool cannot hold now does the same until it can.
        fits = [r for r in joined if len(self.states[r].draft_ids) <= longest_drafting]
        if fits:
            self._prefill_joined(fits)
        for row in joined:
            self.unread_prompt_tokens -= self.unread_prompts.pop(row)
        draft_id_lists = [self.states[r].draft_ids for r in rows]
        pending = self._pending_ids(rows, draft_id_lists)
        live = self._rows_with_room(rows, draft_id_lists, k)
        if live is None:
            return self._draft(rows, pending, sampling, k)
        batch = len(rows)
        draft_target_ids = torch.full((batch, k), FULL_ROW_PROPOSAL, dtype=torch.long, device=self.device)
        draft_probs = None
        if sampling is not None and sampling.keys is None:
            draft_probs = torch.zeros(batch, k, self.vocab.target_vocab_rows, device=self.device)
            draft_probs[..., FULL_ROW_PROPOSAL] = 1.0
        if live:
            index = host_to_device(live, self.device, torch.long)
            live_sampling = None if sampling is None else sampling.rows(live)
            drafted = self._draft([rows[i] for i in live], [pending[i] for i in live], live_sampling, k)
            draft_target_ids[index] = drafted.draft_target_ids
            if draft_probs is not None:   # a rare path (a full draft cache): q over the whole target vocabulary
                drafted_probs = self.vocab.scatter_probs(drafted.draft_probs)                  # [L, k, V_target]
                draft_probs = draft_probs.to(drafted_probs.dtype)
                draft_probs[index] = drafted_probs
        return Proposal(draft_target_ids, draft_probs)

    def _prefill_joined(self, rows: list[int]) -> None:
        """One padded forward over the prompts of the rows that joined (all but their last token), after the longest
        prefix the draft's cache holds already (its own token ids: the same text reads the same ids). A row whose
        blocks the pool cannot hold now reads its prompt when it next drafts with room."""
        cache, states = self.runner.cache, self.states
        prefill_rows, pieces = [], []
        for row in rows:
            draft_ids = states[row].draft_ids
            start = cache.attach_prefix(row, draft_ids, len(draft_ids) - 1)
            if start < len(draft_ids) - 1 and cache.try_reserve([row], [len(draft_ids) - 1]):
                prefill_rows.append(row)
                pieces.append(draft_ids[start:-1])
        if prefill_rows:
            self.runner.prefill_rows(prefill_rows, pieces)
            for row in prefill_rows:
                cache.publish(row, states[row].draft_ids)

    def _rows_with_room(self, rows: list[int], draft_id_lists: list[list[int]], k: int) -> list[int] | None:
        """Reserve blocks for each row's pending ids and k - 1 proposals past them; None where every row has them
        (one reserve for all), else the indices of the rows that do. The others propose FULL_ROW_PROPOSAL: past
        max_len (another tokenizer may spell the text in many more tokens than the target's), or with the pool short
        (the draft's tokens per target token above what its pool was sized for)."""
        cache = self.runner.cache
        ends = [n + k - 1 for n in map(len, draft_id_lists)]
        if max(ends) <= cache.max_len and cache.try_reserve(rows, ends):
            return None
        live = []
        for i, (row, end) in enumerate(zip(rows, ends)):
            if end <= cache.max_len and cache.try_reserve([row], [end]):
                live.append(i)
        return live

    def _draft(self, rows: list[int], pending: list[list[int]], sampling: SamplingBatch | None, k: int) -> Proposal:
        """Feed each row's pending draft ids, then write k tokens (k - 1 more single-token forwards)."""
        runner = self.runner
        lengths = list(map(len, pending))
        width = max(lengths)
        draft_input = host_to_device([p + [0] * (width - n) for p, n in zip(pending, lengths)], self.device, torch.long)
        hidden = runner.forward(rows, draft_input, num_new=lengths)                       # [B, P, hidden]
        last = host_to_device(lengths, self.device, torch.long) - 1
        hidden = hidden[torch.arange(len(rows), device=self.device), last][:, None]      # [B, 1, hidden]
        head_rows, head_probs = [], []
        coupled = sampling is not None and sampling.keys is not None   # draws with the target's noise: no q needed
        # One draw per row for the k tokens (row i's k uniforms come from its own stream, in one call).
        uniforms = None if sampling is None or coupled else draw_uniforms(sampling.randoms, k, self.device)  # [B, k]
        for i in range(k):
            if sampling is None:
                chosen = runner.greedy_ids(hidden)                                         # [B, 1] head rows
            elif coupled:   # target position i's key, each head row's target id's noise, within the request's cut
                chosen = propose_coupled(runner, hidden, sampling.temperature, sampling.keys[:, i:i + 1],
                                         sampling.top_k, sampling.top_p, sampling.top_k_max,
                                         self.vocab.head_to_target)                       # [B, 1] head rows
            else:
                logits = runner.logits(hidden)                                            # [B, 1, N_head]
                probs = logits_to_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p,
                                        sampling.any_greedy)                              # [B, 1, N_head]
                chosen = sample_from_probs(probs, uniforms[:, i:i + 1])                  # [B, 1]
                head_probs.append(probs)
            head_rows.append(chosen)
            if i == 0:
                first_done = time.perf_counter()
            if i < k - 1:
                hidden = runner.forward(rows, self.vocab.to_draft_input(chosen))
        self.later_draft_seconds = time.perf_counter() - first_done
        return self.vocab.proposal(torch.cat(head_rows, dim=1),                            # [B, k]
                                   torch.cat(head_probs, dim=1) if head_probs else None)  # [B, k, N_head]

    def observe(self, rows: list[int], num_accepted: list[int], new_target_ids: list[list[int]]) -> None:
        k, drafted = self.num_proposed, self.drafted_rows
        self.drafted_rows = frozenset()   # a later observe (rows joining) follows no propose
        if drafted.issuperset(rows):   # the common drafting step: every row drafted
            read_rows, read_ids, accepted = rows, new_target_ids, num_accepted
        else:
            waiting = {row: ids for row, ids in zip(rows, new_target_ids) if row not in drafted}
            self.backlog.append(waiting)   # rows with nothing new in the cache: they read this when they next draft
            if not drafted:   # a plain step
                return
            picked = [i for i, row in enumerate(rows) if row in drafted]
            read_rows = [rows[i] for i in picked]
            read_ids = [new_target_ids[i] for i in picked]
            accepted = [num_accepted[i] for i in picked]
        if read_rows:   # the cache holds draft_ids + proposals 1..k-1; the accepted ones are known on host
            self._extend_rows(read_rows, read_ids, [n if n < k else k - 1 for n in accepted])

    def _read_backlog(self, rows: list[int]) -> None:
        """Re-sync `rows` on the text appended since each last drafted, the rows' concatenated
        entries at once (re-sync reads target tokens one at a time, so one call on their concatenation is the calls
        in turn), then drop the entries every row has read."""
        if not self.backlog:
            return
        end = self.backlog_base + len(self.backlog)
        read_rows, read_ids = [], []
        for row in rows:
            start = self.backlog_start.get(row, end)
            if start < end:
                target_ids = [t for entry in self.backlog[start - self.backlog_base:] for t in entry.get(row, ())]
                if target_ids:
                    read_rows.append(row)
                    read_ids.append(target_ids)
                self.backlog_start[row] = end
        if read_rows:
            self._extend_rows(read_rows, read_ids, [0] * len(read_rows))
        self._drop_read_backlog()

    def _drop_read_backlog(self) -> None:
        """Drop the entries every live row has read (or joined after): the backlog spans at most the oldest live
        request's plain steps."""
        first_unread = min(self.backlog_start.values(), default=self.backlog_base + len(self.backlog))
        del self.backlog[:first_unread - self.backlog_base]
        self.backlog_base = first_unread

    def _extend_rows(self, rows: list[int], target_id_lists: list[list[int]], num_fed: list[int]) -> None:
        """Append target tokens to each row's draft text; its cache keeps the prefix that re-sync left unchanged, plus
        the first num_fed[i] new tokens where the cache holds them already (the accepted proposals fed back while
        drafting) and they survive as the same draft ids. Rows that re-sync only appends to (no bytes pending, every
        token in the draft's vocabulary: most rows of most steps) go through in a few calls for all of them."""
        states = [self.states[row] for row in rows]
        num_before = list(map(len, [state.draft_ids for state in states]))
        appended = self.vocab.sync.append_direct(states, target_id_lists)
        keep = [n + fed for n, fed in zip(num_before, num_fed)]   # appended: the fed proposals are the first new ids
        if False in appended:
            for i, (state, target_ids, fed, done) in enumerate(zip(states, target_id_lists, num_fed, appended)):
                if not done:
                    keep[i] = self._resync_row(state, target_ids, fed)
        self.runner.cache.keep_at_most(rows, keep)

    def _resync_row(self, state, target_ids: list[int], num_fed: int) -> int:
        """Re-sync one row on its new target tokens; returns how many draft ids at the front still hold in its cache."""
        fed_accepted = [self.vocab.sync.draft_id_of(t) for t in target_ids[:num_fed]]
        num_before = len(state.draft_ids)
        num_dropped = self.vocab.sync.extend(state, target_ids)
        keep = num_before - num_dropped
        while (keep - num_before < len(fed_accepted) and keep < len(state.draft_ids)
               and keep >= num_before and state.draft_ids[keep] == fed_accepted[keep - num_before]):
            keep += 1
        return keep
