"""A bench result as text: the markdown table and the cost-model lines."""
from __future__ import annotations


def _fmt(value, pattern: str = "{:.2f}") -> str:
    return "-" if value is None else pattern.format(value)


PAIR_KINDS = {"grown": "grown: a real architecture's shape via `anydraft grow`, same logits as the shipped model",
              "shipped": "shipped: small trained model", "local": "local checkpoint"}


def _model_line(label: str, name: str, kind: str | None, shape: str | None) -> str:
    text = PAIR_KINDS.get(kind, "") if kind else ""
    if kind == "grown" and shape:
        text = text.replace("a real architecture's shape", f"the {shape} shape")
    return f"{label} {name}" + (f" ({text})" if text else "")


def header(cfg: dict) -> str:
    """Batch size and which pair: the first thing a reader of the table must know."""
    pair = cfg.get("pair") or {}
    batch = cfg.get("batch_size", 1)
    grouping = "each prompt alone" if batch == 1 else f"groups of {batch} prompts decoded together"
    return (f"**Batch size {batch}** ({grouping}); " + _model_line("target", cfg["target_name"], pair.get("target"),
                                                                  pair.get("target_shape"))
            + "; " + _model_line("draft", cfg["draft_name"], pair.get("draft"), pair.get("draft_shape")) + ".\n")


def _k_text(run: dict) -> str:
    return f"<={run['k']} adaptive" if run.get("adaptive") else str(run["k"])


def markdown_table(result: dict) -> str:
    cfg = result["config"]
    lines = [header(cfg)]
    if cfg.get("emulated"):
        lines.append(f"**EMULATED target cost**: {cfg['target_name']} inflated to {cfg['inflate_target']} "
                     f"(layers x MLP rows; zero-output extra layers and MLP rows, identical logits).\n")
    lines += ["| contender | k | tok/s median | tok/s best | AL | speedup vs own target alone | ideal (cost model) "
              "| GSM8K acc | exact = target alone |",
              "|---|---|---|---|---|---|---|---|---|"]
    for run in result["runs"]:
        exact = run.get("exact_matches_vs_target_alone")
        exact_text = "-" if exact is None else f"{exact}/{cfg['num_prompts']}"
        lines.append(
            f"| {run['name']} | {_k_text(run)} | {run['tokens_per_second_median']:.1f} | {run['tokens_per_second_best']:.1f} "
            f"| {_fmt(run.get('acceptance_length'))} | {_fmt(run.get('speedup_vs_target_alone'), '{:.2f}x')} "
            f"| {_fmt(run.get('ideal_speedup'), '{:.2f}x')} | {_fmt(run.get('gsm8k_accuracy'), '{:.2f}')} "
            f"| {exact_text} |")
    if cfg.get("batch_size", 1) > 1:
        lines.append(f"\nExact matches: per prompt, against anydraft's target alone at the same batch size "
                     f"({cfg['batch_size']} rows; anydraft's native kernels are batch-invariant, PyTorch fallback "
                     f"kernels in bf16 may not be).")
    costs = result["costs"]
    k = str(cfg["k"])
    lines.append("")
    lines.append(f"Forward costs (median, {costs.get('rows', 1)} rows, context {costs['context_tokens']} tokens): T_target {costs['target_seconds'] * 1e3:.2f} ms, "
                 f"T_verify(k={k}) {costs['verify_seconds'][k] * 1e3:.2f} ms, T_draft (TLI, pruned head) "
                 f"{costs['draft_seconds'] * 1e3:.2f} ms; target/draft cost ratio {costs['target_to_draft_cost_ratio']:.1f}x.")
    for key, label in (("same_vocab_draft", "same-vocab"), ("same_vocab_fr_draft", "same-vocab, FR head"),
                       ("tli_fr_draft", "TLI, FR head")):
        if f"{key}_seconds" in costs:
            lines[-1] += f" T_draft ({label}) {costs[f'{key}_seconds'] * 1e3:.2f} ms."
    roofline = result.get("roofline")
    if roofline:
        bandwidth = roofline["bandwidth"]
        lines.append("")
        lines.append(f"Roofline: memory bandwidth {bandwidth['bytes_per_second'] / 1e9:.1f} GB/s (one {bandwidth['dtype']} "
                     f"GEMV over {bandwidth['bytes'] / 1e9:.2f} GB, as many bytes as the target's weights, by "
                     f"{bandwidth.get('gemv', 'torch.mm')}, the fastest GEMV at hand, "
                     f"{bandwidth['threads']} threads), so a batch-1 decode step takes at least "
                     f"{roofline['target_weight_bytes'] / bandwidth['bytes_per_second'] * 1e3:.1f} ms. Target alone: "
                     + "; ".join(_roofline_row(row) for row in roofline["target_alone"]))
        interleaved = bandwidth.get("interleaved")
        if interleaved and interleaved["pairs"]:
            lines.append("")
            lines.append(f"Roofline, alternating ({interleaved['pairs']} anydraft target-alone decode steps, each "
                         f"followed by that GEMV): step {interleaved['step_seconds_median'] * 1e3:.1f} ms, GEMV "
                         f"{interleaved['gemv_seconds_median'] * 1e3:.1f} ms (medians): the step reaches "
                         f"**{interleaved['fraction_of_bound_median']:.0%}** of the bound (median of the pairs).")
    startups = [(run["name"], run["startup_seconds"]) for run in result["runs"] if run.get("startup_seconds")]
    if startups:
        lines.append("")
        lines.append("Startup (not in any timing): " + "; ".join(f"{name} {seconds:.0f} s" for name, seconds in startups))
    if result.get("sweep_k"):
        lines.append("")
        lines.append("| k | " + " | ".join(str(r["k"]) for r in result["sweep_k"]) + " |")
        lines.append("|---|" + "---|" * len(result["sweep_k"]))
        lines.append("| AL | " + " | ".join(f"{r['acceptance_length']:.2f}" for r in result["sweep_k"]) + " |")
        lines.append("| speedup | " + " | ".join(f"{r['speedup']:.2f}x" for r in result["sweep_k"]) + " |")
        lines.append("| ideal | " + " | ".join(f"{r['ideal_speedup']:.2f}x" for r in result["sweep_k"]) + " |")
    adaptive = result.get("sweep_adaptive")
    if adaptive:
        best = adaptive["best_fixed"]
        lines.append("")
        lines.append(f"Adaptive (k <= {adaptive['max_k']}, in the same sweep round): {adaptive['tokens_per_second']:.1f} "
                     f"tok/s, AL {adaptive['acceptance_length']:.2f}, {adaptive['speedup']:.2f}x the target alone, "
                     f"{adaptive['vs_best_fixed']:.2f}x the best of target alone and fixed k "
                     f"({'target alone' if best['k'] == 0 else 'k=' + str(best['k'])}, {best['tokens_per_second']:.1f} "
                     f"tok/s); k per row step: {adaptive['k_histogram']}")
    for name, reason in result.get("skipped", {}).items():
        lines.append(f"\n{name} skipped: {reason}")
    return "\n".join(lines)


def _roofline_row(row: dict) -> str:
    text = (f"{row['name']} {row['seconds_per_token'] * 1e3:.1f} ms/token, prompt forward included = "
            f"{row['fraction_of_bound']:.0%} of the bound")
    if "decode_seconds_per_token" in row:
        text += (f" (decode alone, after the first token: {row['decode_seconds_per_token'] * 1e3:.1f} ms/token = "
                 f"{row['decode_fraction_of_bound']:.0%})")
    return text
