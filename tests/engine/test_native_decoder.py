"""The native decoder body (model/native_extension.py): as close to float64 as the PyTorch bf16 path, bit-identical across
batch shapes, and so greedy speculative decoding with it equals the target alone token for token in bf16."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from anydraft.config import SamplingParams
from anydraft.model.config import ModelConfig
from anydraft.model.loader import load_model, resolve_model_path
from anydraft.model import native_extension
from anydraft.model.native_extension import (CSRC, _build_dir, _sources_in, build_sources, why_not_hardware,
                                              why_not_native, why_not_screened_head)
from anydraft.model.runner import ModelRunner

from tiny_models import TOKENIZERS, gsm8k_questions, make_checkpoint

CPU = torch.device("cpu")
ELIGIBLE = ModelConfig(architecture="LlamaForCausalLM", vocab_size=300, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
# Only the hardware may skip the native tests: on a CPU with AVX-512 a failed build fails them.
HARDWARE = why_not_hardware()
SCREENED = why_not_screened_head()   # the screened heads' condition (NativeHead)
needs_native = pytest.mark.skipif(HARDWARE is not None, reason=f"hardware: {HARDWARE}")

# hidden 64 with 4 heads: head_dim 16, the smallest size the kernels take; the three attention variants.
ARCHS = {"LlamaForCausalLM": "llama2", "Qwen2ForCausalLM": "gpt2", "Qwen3ForCausalLM": "qwen3"}


@pytest.fixture(scope="module")
def native_ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("native")
    vocab = {"llama2": 32000, "gpt2": 50257, "qwen3": 151936}
    return {arch: make_checkpoint(root / arch, arch, TOKENIZERS / tok, vocab[tok], hidden=64, layers=2, heads=4,
                                  kv_heads=2, seed=7, head_scale=4.0)
            for arch, tok in ARCHS.items()}


def _runner(path, monkeypatch, native: bool, max_batch: int = 2) -> ModelRunner:
    monkeypatch.setenv("ANYDRAFT_NATIVE", "1" if native else "0")
    runner = ModelRunner.load(path, torch.bfloat16, CPU, max_batch=max_batch, max_len=64)
    assert (runner.native_unavailable is None) == native, runner.native_unavailable
    return runner


def expected_matmul_path(width: int) -> str:
    """The documented rule (csrc/linear.h): AMX from width 128 where the CPU has it, every width with
    ANYDRAFT_NATIVE_AMX=1, never with =0; widths that are multiples of 32 only."""
    setting = os.environ.get("ANYDRAFT_NATIVE_AMX")
    amx = (native_extension.cpu_has("amx_bf16") and setting != "0" and width % 32 == 0
           and (width >= 128 or setting == "1"))
    return "amx" if amx else "avx512" if native_extension.has_avx512() else "avx2"


@needs_native
def test_matmul_path_follows_the_width_rule():
    extension = native_extension.load_extension()
    for width in (64, 96, 128, 192, 200, 512, 992, 1024, 1040, 2048, 6144):
        assert extension.matmul_path(width) == expected_matmul_path(width), width


@needs_native
def test_runner_reports_which_kernels_run(native_ckpts, monkeypatch):
    runner = _runner(native_ckpts["Qwen3ForCausalLM"], monkeypatch, native=True)
    kernels = runner.kernels
    assert kernels["body"] == "native" and kernels["matmul"] in ("amx", "avx512", "amx+avx512", "avx2")
    screened = native_extension.why_not_screened_head()
    assert kernels["head"] == ("native" if screened is None else f"native logits: {screened}")
    c = runner.cfg
    widths = (c.hidden_size, c.num_attention_heads * c.head_dim, c.intermediate_size)
    assert kernels["matmul"] == "+".join(sorted({expected_matmul_path(k) for k in widths}))
    assert _runner(native_ckpts["Qwen3ForCausalLM"], monkeypatch, native=False).kernels == {
        "body": "pytorch: turned off by ANYDRAFT_NATIVE=0",
        "head": "pytorch: the native body does not run (turned off by ANYDRAFT_NATIVE=0)", "matmul": "pytorch"}


def test_why_not_native_names_the_reason(monkeypatch):
    odd = ModelConfig(**{**ELIGIBLE.__dict__, "hidden_size": 40, "head_dim": 10})
    if HARDWARE is not None:   # this CPU's reason comes first, whatever the model
        assert why_not_native(odd, CPU, torch.bfloat16) == HARDWARE
    monkeypatch.setattr(native_extension, "why_not_hardware", lambda: None)   # the size rule, on any CPU
    assert "multiples of 16" in why_not_native(odd, CPU, torch.bfloat16)
    assert "bfloat16 on CPU" in why_not_native(ELIGIBLE, CPU, torch.float32)
    monkeypatch.setenv("ANYDRAFT_NATIVE", "0")
    assert "ANYDRAFT_NATIVE=0" in why_not_native(ELIGIBLE, CPU, torch.bfloat16)


def test_build_dir_is_keyed_on_the_cpu_feature_flags(monkeypatch):
    """A VM can hide AVX-512 under the same CPU model name: its binary must not be the cached one."""
    fields = {"model name": "Some CPU @ 2.0GHz", "flags": "fpu sse2 avx2 avx512f avx512bw avx512_vnni"}
    monkeypatch.setattr(native_extension, "_cpuinfo", lambda field: fields.get(field, ""))
    full = _build_dir()
    assert _build_dir() == full
    fields["flags"] = "fpu sse2 avx2"
    assert _build_dir() != full and _build_dir().parent == full.parent


def test_the_build_compiles_copies_inside_its_keyed_folder_so_checkouts_share_it(tmp_path):
    """The build file names source paths: compiled from the checkout, two checkouts with the same sources (same
    key) rebuilt over each other's binary. Copies inside the keyed folder are one path for all; an existing copy
    is left alone (its time stamp tells ninja nothing changed)."""
    sources = _sources_in(tmp_path)
    assert [p.parent for p in sources] == [tmp_path / "src"] * len(build_sources())
    assert [p.read_bytes() for p in sources] == [p.read_bytes() for p in build_sources()]
    headers = {p.name for p in CSRC.iterdir() if p.suffix == ".h"}
    assert headers <= {p.name for p in (tmp_path / "src").iterdir()}   # relative includes resolve
    stamps = [p.stat().st_mtime_ns for p in sources]
    assert _sources_in(tmp_path) == sources and [p.stat().st_mtime_ns for p in sources] == stamps


def _run_python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env}, cwd=os.getcwd())


@needs_native
def test_a_failed_build_is_tried_once_and_reported_once_with_the_compilers_message(tmp_path):
    """A compiler that fails (here a stand-in printing two lines): one attempt per process, its whole message on
    stderr once, and every runner says the body and head run on PyTorch, and why."""
    compiler = tmp_path / "failing-c++"
    compiler.write_text("#!/bin/sh\ncase \" $* \" in *' -c '*) ;; *) exec c++ \"$@\";; esac\n"   # compiles fail
                        "echo 'fake.cpp:1: error: first line of the reason' >&2\n"
                        "echo 'fake.cpp:2: note: second line of the reason' >&2\necho called >> \"$0.calls\"\nexit 1\n")
    compiler.chmod(0o755)
    done = _run_python("""
        import torch
        from anydraft.model.runner import ModelRunner
        from tiny_models import TOKENIZERS, make_checkpoint
        path = make_checkpoint(__import__("pathlib").Path(%r) / "ckpt", "Qwen3ForCausalLM", TOKENIZERS / "qwen3",
                               151936, hidden=64, layers=1, heads=4, kv_heads=2, seed=1)
        for _ in range(2):
            runner = ModelRunner.load(path, torch.bfloat16, torch.device("cpu"), max_batch=1, max_len=8)
            print(runner.kernels)
        """ % str(tmp_path), CXX=str(compiler), ANYDRAFT_NATIVE_DIR=str(tmp_path / "native"),
        PYTHONPATH=os.pathsep.join([str(__import__("pathlib").Path(__file__).parent), os.getcwd()]))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("did not build") == 1, done.stderr
    calls = compiler.with_name(compiler.name + ".calls").read_text().split()
    assert 1 <= len(calls) <= len(native_extension.build_sources())   # one build: at most one compile per source
    # the compiler's whole message, once per compile of that one build
    assert done.stderr.count("first line of the reason") == done.stderr.count("second line of the reason") == len(calls)
    reports = [eval(line) for line in done.stdout.splitlines()]
    assert len(reports) == 2 and all(r["body"].startswith("pytorch: the extension did not build") for r in reports)
    assert all(r["head"].startswith("pytorch: the native body does not run") for r in reports)


def test_the_build_finds_ninja_off_path():
    """The `ninja` package's binary sits in the environment's scripts folder, which is not on PATH when the
    environment is used without activation: the build puts it there (torch looks ninja up on PATH)."""
    import ninja  # noqa: F401  (a declared dependency: missing is a failure, not a skip)
    done = _run_python("""
        import os
        from torch.utils.cpp_extension import is_ninja_available
        from anydraft.model.native_extension import _ninja_on_path
        assert not is_ninja_available(), "ninja found on a PATH without it"
        with _ninja_on_path():
            assert is_ninja_available()
        assert not is_ninja_available() and os.environ["PATH"] == "/nonexistent"
        """, PATH="/nonexistent")
    assert done.returncode == 0, done.stderr[-3000:]


@needs_native
def test_a_killed_build_does_not_block_later_loads():
    """torch's lock file stays behind when a build is killed (Ctrl-C during the first minute); a later load
    must clear it rather than wait on it forever."""
    stale = _build_dir() / "lock"
    stale.parent.mkdir(parents=True, exist_ok=True)   # the folder of a build not made yet in this session
    stale.touch()
    try:
        done = subprocess.run([sys.executable, "-c", "from anydraft.model.native_extension import load_extension; "
                               "load_extension()"], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert not stale.exists()
    finally:
        stale.unlink(missing_ok=True)


@needs_native
@pytest.mark.parametrize("arch", list(ARCHS))
def test_native_is_as_close_to_float64_as_the_pytorch_path(native_ckpts, monkeypatch, arch):
    """Both bf16 paths against the float64 model: the native one may round differently, not worse."""
    input_ids = torch.randint(0, 1000, (2, 13), generator=torch.Generator().manual_seed(3))
    errors, reference, _ = _float64_errors(native_ckpts[arch], monkeypatch, input_ids)
    assert errors[True] <= 1.5 * errors[False], errors
    assert errors[True] < 0.05 * reference.abs().mean().item()


def _float64_errors(path, monkeypatch, input_ids: torch.Tensor):
    """Mean absolute logit error of the native (True) and PyTorch (False) bf16 paths against the float64 model, for
    rows 0.. of input_ids [B, S]; also the float64 logits and (runner, logits) of the native path."""
    exact, _ = load_model(path, torch.float64, CPU)
    with torch.inference_mode():
        reference = exact.logits(exact(input_ids))
    errors, native_out = {}, None
    for native in (True, False):
        runner = _runner(path, monkeypatch, native)
        logits = runner.logits(runner.forward(list(range(input_ids.shape[0])), input_ids))
        errors[native] = (logits.double() - reference).abs().mean().item()
        native_out = native_out or (runner, logits)
    return errors, reference, native_out


@needs_native
@pytest.mark.parametrize("arch", list(ARCHS))
def test_native_rows_are_bit_identical_whatever_the_batch_shape(native_ckpts, monkeypatch, arch):
    """k+1 tokens at once = one at a time; two rows of different lengths together = each alone."""
    runner = _runner(native_ckpts[arch], monkeypatch, native=True)
    gen = torch.Generator().manual_seed(5)
    prompt, new = torch.randint(0, 1000, (1, 9), generator=gen), torch.randint(0, 1000, (1, 4), generator=gen)
    runner.prefill(0, prompt[0].tolist())
    together = runner.logits(runner.forward([0], new))
    runner.cache.rewind([0], [4])
    one_by_one = torch.cat([runner.logits(runner.forward([0], new[:, i:i + 1])) for i in range(4)], dim=1)
    assert torch.equal(together, one_by_one)

    # Row 1 joins with a shorter prompt; both rows then verify in one right-padded forward.
    runner.cache.reset(0)
    runner.prefill_rows([0, 1], [prompt[0].tolist(), prompt[0, :5].tolist()])
    padded = torch.stack([new[0], torch.tensor([new[0, 0], new[0, 1], 0, 0])])
    both = runner.logits(runner.forward([0, 1], padded, num_new=[4, 2]))
    assert torch.equal(both[0], together[0])
    runner.cache.reset(0)
    runner.cache.reset(1)
    runner.prefill(1, prompt[0, :5].tolist())
    alone = runner.logits(runner.forward([1], new[:, :2]))
    assert torch.equal(both[1, :2], alone[0])


@needs_native
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (6, 2), (10, 2), (8, 1)])
def test_attention_of_any_query_group_size_is_exact_per_query(tmp_path, monkeypatch, heads, kv_heads):
    """Query heads per KV head of 1, 3, 5 and 8 (the AVX2 kernel attends up to 4 of a group at once, so 5 and 8 split
    in two): close to float64 as the PyTorch path is, and a 40-token forward (more keys than a 16-key group) equals
    the same tokens one at a time, bit for bit."""
    path = make_checkpoint(tmp_path / "ckpt", "LlamaForCausalLM", TOKENIZERS / "llama2", 32000, hidden=16 * heads,
                           layers=2, heads=heads, kv_heads=kv_heads, seed=11)
    tokens = torch.randint(0, 1000, (1, 40), generator=torch.Generator().manual_seed(2))
    errors, _, (runner, logits) = _float64_errors(path, monkeypatch, tokens)
    assert errors[True] <= 1.5 * errors[False], errors
    runner.cache.reset(0)
    one_by_one = torch.cat([runner.logits(runner.forward([0], tokens[:, i:i + 1])) for i in range(40)], dim=1)
    assert torch.equal(logits, one_by_one)


@needs_native
def test_a_ragged_prefill_runs_only_real_tokens_and_gives_each_prompt_its_alone_values(native_ckpts, monkeypatch):
    """Prompts of 11, 3 and 7 tokens joining together: one native call over their 21 tokens (no padding), and the
    same last hidden states and cache entries as each prompt prefilled alone."""
    runner = _runner(native_ckpts["Qwen3ForCausalLM"], monkeypatch, native=True, max_batch=3)
    gen = torch.Generator().manual_seed(8)
    prompts = [torch.randint(0, 1000, (n,), generator=gen).tolist() for n in (11, 3, 7)]
    native, shapes = runner.model.native, []

    def spy(input_ids, *args):
        shapes.append(tuple(input_ids.shape))
        return native(input_ids, *args)

    monkeypatch.setattr(runner.model, "native", spy)
    together = runner.prefill_rows([0, 1, 2], prompts)
    assert shapes == [(1, 21)]
    cache_together = [runner.cache.entries(r) for r in range(len(prompts))]
    for row, prompt in enumerate(prompts):
        runner.cache.reset(row)
        alone = runner.prefill(row, prompt)
        assert torch.equal(alone[0], together[row])
        keys, values = runner.cache.entries(row)
        assert keys.shape[1] == len(prompt)
        assert torch.equal(keys, cache_together[row][0]) and torch.equal(values, cache_together[row][1])
    assert shapes[1:] == [(1, 11), (1, 3), (1, 7)]


@needs_native
def test_native_writes_the_same_cache_as_the_pytorch_path(native_ckpts, monkeypatch):
    """Keys and values land at the same slots: a rewind then a rewrite leaves no trace of the old tokens."""
    runner = _runner(native_ckpts["Qwen3ForCausalLM"], monkeypatch, native=True)
    ids = torch.randint(0, 1000, (1, 10), generator=torch.Generator().manual_seed(6))
    first = runner.logits(runner.forward([1], ids))
    runner.cache.rewind([1], [4])
    runner.forward([1], torch.randint(0, 1000, (1, 4)))   # overwrites the last four entries
    runner.cache.rewind([1], [4])
    again = runner.logits(runner.forward([1], ids[:, 6:]))
    assert torch.equal(again[0], first[0, 6:])


@needs_native
@pytest.mark.parametrize("target, draft", [("qwen3-target", "smollm2-draft"), ("smollm2-target", "qwen3-draft")])
def test_bf16_greedy_speculative_equals_target_alone_exactly(llms, target, draft):
    """The shipped pairs in bf16 (TLI): with batch-invariant rows there are no near-tie exceptions."""
    target_dir, draft_dir = resolve_model_path(target), resolve_model_path(draft)
    spec = llms.get(target_dir, draft_dir, k=3, dtype="bfloat16", max_model_len=512)
    alone = llms.get(target_dir, None, dtype="bfloat16", max_model_len=512)
    assert spec.target.native_unavailable is None and spec.proposer.runner.native_unavailable is None
    questions = [f"Question: {q}\nAnswer:" for q in gsm8k_questions(6, start=40)]
    params = SamplingParams(temperature=0, max_tokens=96)
    spec_out, alone_out = spec.generate(questions, params), alone.generate(questions, params)
    assert [o.outputs[0].token_ids for o in spec_out] == [o.outputs[0].token_ids for o in alone_out]
    assert spec.stats.acceptance_length > 2.0   # the shipped pairs agree often: real verification happened


@needs_native
def test_inflated_target_keeps_its_logits_on_the_native_body_at_any_width(native_ckpts):
    """The cost-emulated target (bench --inflate-target) keeps the trained logits bit for bit on the native
    body (its widened MLPs run as one MLP whose extra down columns are zero), also once its layers are large
    (gate/up 32768 x 64: the native body has no size limit)."""
    from anydraft.bench.inflate import inflate_model, parse_inflate_spec
    path = native_ckpts["Qwen3ForCausalLM"]
    ids = torch.randint(0, 1000, (1, 12), generator=torch.Generator().manual_seed(8))
    logits = []
    for inflate in (None, "4x256", "3x16384"):
        model, _ = load_model(path, torch.bfloat16, CPU)
        if inflate:
            inflate_model(model, parse_inflate_spec(inflate))
        runner = ModelRunner(model, max_batch=1, max_len=32)
        assert runner.native_unavailable is None
        logits.append(torch.cat([runner.logits(runner.forward([0], ids[:, :7]))] +
                                [runner.logits(runner.forward([0], ids[:, i:i + 1])) for i in range(7, 12)], dim=1))
    assert torch.equal(logits[0], logits[1]) and torch.equal(logits[0], logits[2])
