"""Memory at scale, tested on CPU: the chunked loss, activation checkpointing, and bench.py's memory estimate against
peaks measured with torch.profiler."""
import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

from scripts import bench
from scripts.bench import estimate, measured_peak
from config import Config
import loss as loss_module
import model as model_module
from jreg import jreg_penalty
from loss import Objective
from model import Llama, LlamaConfig
from conftest import assert_close_ulps

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(**kw):
    return LlamaConfig(**{**dict(vocab_size=97, n_layer=3, n_head=4, n_kv_head=2, d_model=32, ffn_hidden=48,
                                 max_seq_len=32), **kw})


def batch(vocab, B=3, T=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, vocab, (B, T), generator=g)
    targets = torch.randint(0, vocab, (B, T), generator=g)
    targets[0, :4] = -1                                          # ignored positions, as padding or prompts give
    targets[-1, -3:] = -1
    return idx, targets


def forward(model, idx, targets, full=False):
    """(output, loss): the training loss (chunked, through the head), or full=True: the cross-entropy of the full
    logits."""
    out = model(idx) if full else model(idx, targets)
    loss = F.cross_entropy(out.logits.float().flatten(0, 1), targets.reshape(-1), ignore_index=-1) if full else out.loss
    return out, loss


def loss_and_grads(model, idx, targets, autocast=False, full=False):
    for p in model.parameters():
        p.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out, loss = forward(model, idx, targets, full)
    loss.backward()
    return out, loss, {n.removeprefix("_orig_mod."): p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("tied,autocast", [(False, False), (True, False), (False, True), (True, True)])
def test_chunked_loss_equals_full_loss_and_gradients(tied, autocast):
    torch.manual_seed(0)
    model = Llama(tiny(tie_embeddings=tied), loss_chunk=7)      # 30 positions: 4 chunks of 7 and a rest of 2
    idx, targets = batch(97)
    full, full_loss, g_full = loss_and_grads(model, idx, targets, autocast, full=True)
    chunked, chunked_loss, g_chunked = loss_and_grads(model, idx, targets, autocast)
    assert chunked.logits is None and full.logits.shape == (3, 10, 97)
    if autocast:                                                # bf16: each chunk's matmul rounds on its own
        assert abs(chunked_loss.item() - full_loss.item()) <= 2e-3
        for n in g_full:
            assert (g_chunked[n] - g_full[n]).abs().max().item() <= 2e-2 * g_full[n].abs().max().item(), n
    else:   # fp32, other kernels (chunks of 7 positions vs 30, each through torch.func.vjp, vs one
        # F.cross_entropy under autograd; sums in another order): equal up to rounding, which differs by CPU. The loss
        # (~4.6): 16 ulps (a 30-term mean; 1e-6 was 1.8 ulps, and this CPU already gives 2); the gradients: 32 ulps
        # at their largest entry (sums over 30 positions; 4.9 measured here).
        assert_close_ulps(chunked_loss, full_loss, ulps=16)
        for n in g_full:
            assert_close_ulps(g_chunked[n], g_full[n], ulps=32)
    for a, b in zip(full.hidden_states, chunked.hidden_states):
        assert torch.equal(a, b)


def test_objective_never_materialises_logits():
    torch.manual_seed(0)
    model = Llama(tiny())
    seen = []
    model.register_forward_hook(lambda module, args, out: seen.append(out.logits))
    idx, targets = batch(97)
    ce, penalty, _, _ = Objective(model)(idx, targets)
    assert seen == [None] and torch.isfinite(ce) and penalty.requires_grad


@pytest.mark.parametrize("autocast", [False, True])
def test_activation_checkpointing_gives_identical_losses_and_gradients(autocast):
    torch.manual_seed(0)
    model = Llama(tiny())
    idx, targets = batch(97)
    objective = Objective(model)

    def run():
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            ce, penalty, _, _ = objective(idx, targets)
        (ce + penalty).backward()
        return ce, penalty, {n: p.grad.clone() for n, p in model.named_parameters()}

    ce, pen, grads = run()
    model.activation_checkpointing = True
    ce2, pen2, grads2 = run()
    assert torch.equal(ce, ce2) and torch.equal(pen, pen2)
    assert all(torch.allclose(grads[n], grads2[n], rtol=0, atol=1e-6) for n in grads)
    with torch.no_grad():                                       # evaluation: the plain forward, same numbers
        assert torch.equal(model(idx, targets).loss, Llama.forward(model, idx, targets).loss)


def test_compiled_training_forward_matches_eager():
    """Checkpointed blocks compiled, the chunked loss's loop outside the graph with each chunk compiled."""
    torch.manual_seed(0)
    model = Llama(tiny(n_layer=2), activation_checkpointing=True, loss_chunk=7)
    idx, targets = batch(97)
    compiled, compiled_loss, g_compiled = loss_and_grads(torch.compile(model), idx, targets)
    eager, eager_loss, g_eager = loss_and_grads(model, idx, targets)
    assert loss_module.compiled_chunk_loss_and_grads.cache_info().currsize == 1     # the chunks ran compiled
    # inductor's generated kernels (vector width and reduction order depend on the CPU) vs eager: equal up to rounding.
    # 16 ulps of the loss (~4.6; 1e-6 was 1.8 ulps): a 30-term mean's last bits
    assert_close_ulps(compiled_loss, eager_loss, ulps=16)
    assert all(torch.allclose(g_compiled[n], g_eager[n], rtol=0, atol=1e-6) for n in g_eager)


def step_peak(model, idx, targets, full=False):
    """Bytes allocated beyond what existed before, at the peak of one forward + backward of the JREG loss."""
    def step():
        out, ce = forward(model, idx, targets, full)
        loss = ce + jreg_penalty(out.hidden_states, 1.0)
        del out
        loss.backward()
    for p in model.parameters():                                 # gradients already allocated, as while accumulating
        p.grad = torch.zeros_like(p)
    return measured_peak(step)


def peak_model():
    torch.manual_seed(0)
    mcfg = tiny(vocab_size=2048, d_model=64, n_head=4, ffn_hidden=128, n_layer=4, max_seq_len=64)
    return Llama(mcfg), *batch(2048, B=4, T=64)


def test_chunked_loss_lowers_the_measured_peak():
    model, idx, targets = peak_model()
    full = step_peak(model, idx, targets, full=True)
    model.loss_chunk = 32
    chunked = step_peak(model, idx, targets)
    assert full - chunked > 8 * idx.numel() * model.config.vocab_size      # the full loss holds ~12 bytes per logit


def test_checkpointing_lowers_the_measured_peak():
    model, idx, targets = peak_model()
    model.loss_chunk = 32
    plain = step_peak(model, idx, targets)
    model.activation_checkpointing = True
    assert step_peak(model, idx, targets) < 0.6 * plain                    # the blocks' activations are most of it


SHAPES = [  # (model shape, batch, seq_len): small enough to run in a second, large enough for the terms to dominate
    (dict(vocab_size=1024, n_layer=3, n_head=4, n_kv_head=4, d_model=128, ffn_hidden=352, max_seq_len=128), 2, 128),
    (dict(vocab_size=512, n_layer=4, n_head=4, n_kv_head=2, d_model=96, ffn_hidden=256, max_seq_len=96), 3, 96),
]


@pytest.mark.parametrize("shape,B,T", SHAPES)
@pytest.mark.parametrize("mode", ["fp32", "autocast"])
@pytest.mark.parametrize("checkpointing,chunk", [(False, 0), (False, 64), (True, 64)])
def test_estimate_matches_measured_activations_and_logits(shape, B, T, mode, checkpointing, chunk):
    """bench.estimate's activations + logits terms within 15% of the peak torch.profiler measures on CPU, eager:
    fp32 (CPU) and fp32 weights under bf16 autocast (train.py on a GPU)."""
    mcfg = LlamaConfig(**shape)
    torch.manual_seed(0)
    model = Llama(mcfg, activation_checkpointing=checkpointing, loss_chunk=chunk or 1024)
    idx, targets = batch(mcfg.vocab_size, B, T)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode != "fp32"):
            out, ce = forward(model, idx, targets, full=not chunk)
            loss = ce + jreg_penalty(out.hidden_states, 1.0)
        del out                                                  # as loss.Objective: nothing but the loss kept
        loss.backward()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    measured = measured_peak(step)
    est = estimate(mcfg, B, T, mode=mode, checkpointing=checkpointing, loss_chunk=chunk, jreg=True)
    predicted = est["activations"] + est["logits"]
    assert abs(predicted / measured - 1) <= 0.15, (predicted, measured, est)


def test_memory_probe_prints_measured_beside_estimated(capsys):
    bench.main(["--memory_probe", "--preset", "tiny", "--vocab_size", "4096", "--micro_batch", "2", "--seq_len", "64",
                "--loss_chunk", "32", "--repeats", "1", "--warmup", "0"])
    out = capsys.readouterr().out
    assert "bytes per logit full" in out and "chunked / full" in out
    ratios = [float(line.split()[-1]) for line in out.splitlines() if line.startswith(("full logits", "chunked"))]
    assert len(ratios) == 3 and all(abs(r - 1) <= 0.15 for r in ratios), out


def test_memory_table_of_configs_and_what_does_not_fit(capsys):
    bench.main(["--memory", "configs/170m.py", "configs/3.4b_jreg.py", "--world", "8"])
    out = capsys.readouterr().out
    assert "configs/170m.py" in out and "DDP compiled" in out and "FSDP compiled" in out and "needs" not in out
    bench.main(["--memory", "configs/3.4b_jreg.py", "--world", "8", "--no-compile", "--gpu_gib", "40"])
    assert "under 10% margin; needs activation_checkpointing=True" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="error: configs/170m.py: batch_tokens"):
        bench.main(["--memory", "configs/170m.py", "--world", "3"])
    for bad in ("0", "-5", "nan", "inf"):                     # (before: a ZeroDivisionError, or a margin of 674%)
        with pytest.raises(SystemExit, match=f"error: argument --gpu_gib: must be a finite number > 0, got {bad}"):
            bench.main(["--memory", "configs/170m.py", "--gpu_gib", bad])


def test_memory_table_of_a_fine_tuning_config_uses_the_shape_it_starts_from(capsys, tmp_path):
    """An init_from config sets no shape: bench.py --memory takes it from the run folder when it is there, else from
    the config beside it that trains init_from (configs/3.4b_jreg.py for out/3.4b_jreg), never the default 170m."""
    bench.main(["--memory", "configs/sft_3.4b_jreg.py", "configs/3.4b_jreg.py", "--world", "8"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("configs/")]
    assert rows[0][:2] == ["configs/sft_3.4b_jreg.py", "FSDP"] and float(rows[0][-2]) > 20   # 3.4B weights, not 170M
    (tmp_path / "sft.py").write_text("init_from = 'out/nowhere'\n")
    (tmp_path / "script.py").write_text("raise RuntimeError('a script beside it was run')\n")   # never run
    (tmp_path / "other.py").write_text("out_dir = 'out/nowhere'\nmc = 1\n")                  # names it, no config
    with pytest.raises(SystemExit, match="error: .*sft.py: init_from 'out/nowhere' is not here, and no config beside"):
        bench.main(["--memory", str(tmp_path / "sft.py"), "--world", "8"])


def test_json_records_the_numbers_the_command_and_the_machine(tmp_path, capsys):
    """--json: what results/collect.py reads from results/speed/: the printed numbers, the command that made them and
    the machine (CPU, threads, torch)."""
    out = tmp_path / "m.json"
    bench.main(["--memory", "configs/170m_jreg.py", "--world", "8", "--json", str(out)])
    printed = capsys.readouterr().out
    record = json.load(open(out))
    assert record["command"] == f"python -m scripts.bench --memory configs/170m_jreg.py --world 8 --json {out}"
    assert {"cpu", "cores", "threads", "torch", "gpu"} <= set(record["machine"])
    row = record["results"]["configs"]["configs/170m_jreg.py"]
    assert f"{row['total']:7.2f}" in printed and row["params"] == 162_220_800 and row["grad_accum"] == 1
