"""Calibration of adaptive speculation's target cost at load: timed target forwards on this machine."""
from __future__ import annotations

import time

import torch

from ..model.runner import ModelRunner
from ..tokenizer import Tokenizer
from .adaptive import AdaptiveSpeculation

CALIBRATION_CONTEXT_TOKENS = 128        # the target cost is calibrated at this context (a GSM8K prompt + answer)
# The calibration forwards read text, not random ids: on random ids the greedy head's screen leaves many rows
# standing (flat logits), which priced a forward up to 40% dearer than on text and misled the first choices.
CALIBRATION_TEXT = ("The store sold 48 clips in April and half as many in May, so it sold 48 / 2 = 24 clips in "
                    "May and 48 + 24 = 72 clips in all. Each box holds 12 pencils; 5 boxes hold 5 * 12 = 60 pencils, "
                    "and after giving away 15 of them, 60 - 15 = 45 pencils are left. ")


def calibrate_target_cost(speculation: AdaptiveSpeculation, target: ModelRunner, tokenizer: Tokenizer, k: int,
                          max_model_len: int) -> None:
    """Time target forwards of 1..k+1 tokens a row over one row and over every row (on CALIBRATION_TEXT, caches
    reset after), so the first steps choose k from this machine's costs; every step then refines them.
    Every size a step over one or all rows may verify is timed: priced by interpolation between 1 and k+1 tokens
    a row, k = 2 over 16 rows of the grown qwen3 pair cost 10% more than measured, and adaptive never drafted there
    (0.95x fixed k = 3), since a size a step never verifies is never re-timed."""
    rows_all = list(range(target.cache.max_batch))
    # Timed over a context of typical length (attention reads it): forwards over empty caches priced the sizes
    # that steps rarely re-measure too cheap, and adaptive then drafted where it loses.
    # Scratch forwards: the states the target captures for a hidden-state draft are dropped after each, never read.
    context = min(CALIBRATION_CONTEXT_TOKENS, max_model_len // 2)
    text_ids = tokenizer.encode(CALIBRATION_TEXT)
    text_ids = (text_ids * (1 + (context + k + 1) // max(len(text_ids), 1)))[:context + k + 1]
    target.prefill_rows(rows_all, [text_ids[:context]] * len(rows_all), chunk=context)
    target.take_hidden_states()
    for rows in ([0], rows_all):
        for num_new in range(1, k + 2):
            ids = torch.tensor([text_ids[context:context + num_new]] * len(rows))
            for repeat in range(4):   # the first is a warm-up
                start = time.perf_counter()
                target.greedy_ids(target.forward(rows, ids.to(target.device))).tolist()
                if repeat:
                    speculation.target_cost.observe(len(rows) * num_new, time.perf_counter() - start)
                target.cache.rewind(rows, [num_new] * len(rows))
                target.take_hidden_states()
    for row in rows_all:
        target.cache.reset(row)
