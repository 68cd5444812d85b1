"""PNG plots of a bench result: acceptance by draft position, and speedup vs k (measured, cost-model ideal, adaptive)."""
from __future__ import annotations

from pathlib import Path


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")   # files only, no display
    import matplotlib.pyplot as plt
    return plt


def _title_suffix(result: dict) -> str:
    cfg = result["config"]
    suffix = f"{cfg['target_name']} + {cfg['draft_name']}, batch {cfg.get('batch_size', 1)}, {cfg['dtype']}"
    if cfg.get("inflate_target"):
        suffix += f"\nEMULATED target cost: {cfg['inflate_target']} (layers x MLP rows), identical logits"
    return suffix


def _finish(plt, fig, ax, title: str, result: dict, path: Path) -> Path:
    """Title (with the run's labels, EMULATED included), legend, save, close."""
    ax.set_title(title + "\n" + _title_suffix(result), fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_acceptance_by_position(result: dict, path: Path) -> Path | None:
    runs = [r for r in result["runs"] if r.get("acceptance_by_position")]
    if not runs:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(runs)
    for i, run in enumerate(runs):
        rates = run["acceptance_by_position"]
        xs = [p + 1 + (i - (len(runs) - 1) / 2) * width for p in range(len(rates))]
        ax.bar(xs, rates, width, label=f"{run['name']} (AL {run['acceptance_length']:.2f})")
    ax.set_xlabel("draft position")
    ax.set_ylabel("P(position accepted)")
    ax.set_ylim(0, 1)
    ax.set_xticks(range(1, max(len(r["acceptance_by_position"]) for r in runs) + 1))
    return _finish(plt, fig, ax, "Acceptance by position", result, path)


def plot_speedup_vs_k(result: dict, path: Path) -> Path | None:
    sweep = result.get("sweep_k") or []
    if not sweep:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    ks = [row["k"] for row in sweep]
    ax.plot(ks, [row["speedup"] for row in sweep], "o-", label="anydraft TLI, measured")
    ax.plot(ks, [row["ideal_speedup"] for row in sweep], "s--", label="cost model: AL·T_target / (T_verify + k·T_draft)")
    ax.axhline(1.0, color="gray", lw=0.8)
    adaptive = result.get("sweep_adaptive")
    if adaptive:
        ax.axhline(adaptive["speedup"], color="green", ls=":", label=f"adaptive (k <= {adaptive['max_k']}), measured")
    for row in sweep:
        ax.annotate(f"AL {row['acceptance_length']:.2f}", (row["k"], row["speedup"]), textcoords="offset points",
                    xytext=(0, -12), ha="center", fontsize=7)
    ax.set_xlabel("k (drafted tokens per step)")
    ax.set_ylabel("speedup vs target alone")
    ax.set_xticks(ks)
    return _finish(plt, fig, ax, "Speedup vs k", result, path)


def write_plots(result: dict, out_dir: Path, stem: str) -> list[str]:
    written = [plot_acceptance_by_position(result, out_dir / f"{stem}_acceptance_by_position.png"),
               plot_speedup_vs_k(result, out_dir / f"{stem}_speedup_vs_k.png")]
    return [str(p) for p in written if p is not None]
