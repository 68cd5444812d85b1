"""Prometheus metrics of the server, named as vLLM's with an `anydraft:` prefix, in a registry of its own.

Speculative counters are fed from the engine's SpecStats (the one definition of drafted / accepted), as
differences since the last step. Inter-token latency is observed once per step that gives a request
tokens, as vLLM does: with speculation one observation can cover several tokens.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST  # noqa: F401  (re-exported for the API server)

from ..metrics import SpecStats

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                    7.5, 10.0, 20.0, 40.0, 80.0)


class ServerMetrics:
    def __init__(self, model_name: str, num_speculative_tokens: int):
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)   # process_resident_memory_bytes etc., as vLLM exposes them
        labels = {"model_name": model_name}
        names = list(labels)

        def counter(name, doc, extra=()):
            return Counter(f"anydraft:{name}", doc, names + list(extra), registry=self.registry)

        self.num_drafts = counter("spec_decode_num_drafts", "Speculative steps (one per request per step)")
        self.num_draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens proposed")
        self.num_accepted_tokens = counter("spec_decode_num_accepted_tokens", "Draft tokens accepted")
        self.accepted_per_pos = counter("spec_decode_num_accepted_tokens_per_pos",
                                        "Draft tokens accepted at each position", ["position"])
        self.request_success = counter("request_success", "Finished requests", ["finished_reason"])
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished requests")
        self.generation_tokens = counter("generation_tokens", "Generated tokens")
        self.running = Gauge("anydraft:num_requests_running", "Requests holding a cache row", names,
                             registry=self.registry)
        self.waiting = Gauge("anydraft:num_requests_waiting", "Requests waiting for a cache row", names,
                             registry=self.registry)
        self.ttft = Histogram("anydraft:time_to_first_token_seconds", "Arrival to first token", names,
                              buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.itl = Histogram("anydraft:inter_token_latency_seconds", "Time between steps giving a request tokens",
                             names, buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.e2e = Histogram("anydraft:e2e_request_latency_seconds", "Arrival to finish", names,
                             buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.kv_cache_usage = Gauge("anydraft:kv_cache_usage_perc",
                                    "Fraction of the KV block pool held by requests (1 = full)", names + ["cache"],
                                    registry=self.registry)
        self.prefix_queries = counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                                      ["cache"])
        self.prefix_hits = counter("prefix_cache_hits", "Prompt tokens found in the prefix cache", ["cache"])
        self.preemptions = counter("num_preemptions", "Requests preempted (blocks freed, re-prefilled later)")
        self.reply_reuse = counter("reply_reuse_tokens", "Prompt tokens given as the ids a finished request read and "
                                                         "wrote, its text being repeated (the reply memory)")
        self._labels = labels
        self._seen_lookups: dict[str, tuple[int, int]] = {}   # cache -> (queried, hit) tokens counted so far
        self._seen_preemptions = 0
        for m in (self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens, self.prompt_tokens,
                  self.generation_tokens, self.running, self.waiting, self.ttft, self.itl, self.e2e, self.preemptions,
                  self.reply_reuse):
            m.labels(**labels)   # present (at 0) from the start, as vLLM's are
        for position in range(num_speculative_tokens):
            self.accepted_per_pos.labels(**labels, position=str(position))
        self._seen = SpecStats(num_speculative_tokens)   # what was counted so far (target_forwards: drafting steps)

    def observe_spec(self, stats: SpecStats) -> None:
        """Add what the engine's aggregate stats gained since the last call."""
        seen, labels = self._seen, self._labels
        drafts = stats.target_forwards - stats.k_histogram.get(0, 0)   # steps that drafted (adaptive may not)
        self.num_drafts.labels(**labels).inc(drafts - seen.target_forwards)
        self.num_draft_tokens.labels(**labels).inc(stats.num_drafted - seen.num_drafted)
        self.num_accepted_tokens.labels(**labels).inc(stats.num_accepted - seen.num_accepted)
        for position, (now, before) in enumerate(zip(stats.accepted_at_position, seen.accepted_at_position)):
            if now > before:
                self.accepted_per_pos.labels(**labels, position=str(position)).inc(now - before)
        seen.target_forwards, seen.num_drafted, seen.num_accepted = drafts, stats.num_drafted, stats.num_accepted
        seen.accepted_at_position = list(stats.accepted_at_position)

    def observe_caches(self, pools: dict, num_preemptions: int) -> None:
        """Pool usage and what the prefix caches and preemptions gained since the last call; pools: name ->
        BlockPool ("target", "draft")."""
        labels = self._labels
        for name, pool in pools.items():
            self.kv_cache_usage.labels(**labels, cache=name).set(pool.usage())
            queried, hit = self._seen_lookups.get(name, (0, 0))
            stats = pool.stats
            self.prefix_queries.labels(**labels, cache=name).inc(stats.queried_tokens - queried)
            self.prefix_hits.labels(**labels, cache=name).inc(stats.hit_tokens - hit)
            self._seen_lookups[name] = (stats.queried_tokens, stats.hit_tokens)
        self.preemptions.labels(**labels).inc(num_preemptions - self._seen_preemptions)
        self._seen_preemptions = num_preemptions

    def observe_queue(self, num_running: int, num_waiting: int) -> None:
        self.running.labels(**self._labels).set(num_running)
        self.waiting.labels(**self._labels).set(num_waiting)

    def observe_tokens(self, num_tokens: int, first: bool, seconds_since: float) -> None:
        """A request got num_tokens; seconds since its arrival (first) or its previous tokens."""
        self.generation_tokens.labels(**self._labels).inc(num_tokens)
        (self.ttft if first else self.itl).labels(**self._labels).observe(seconds_since)

    def observe_finished(self, reason: str, num_prompt_tokens: int, seconds_since_arrival: float) -> None:
        self.request_success.labels(**self._labels, finished_reason=reason).inc()
        self.prompt_tokens.labels(**self._labels).inc(num_prompt_tokens)
        self.e2e.labels(**self._labels).observe(seconds_since_arrival)

    def observe_reply_reuse(self, num_tokens: int) -> None:
        self.reply_reuse.labels(**self._labels).inc(num_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
