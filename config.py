"""
Every training setting with its default (`Config`), read from config files and `--key=value`, and checked before
anything is built or written. A config file is Python (trusted input) assigning some of the keys; `include("x.py")`
reads another file of the same folder first. An unknown key, a wrong type or a value out of range is one `error:` line.
Once loaded the settings are frozen (`cfg.lr = 0.5` raises): what config.json records is what ran.

    cfg = load_config(["configs/tiny.py", "--max_steps=50"])      # defaults <- files <- command line
    cfg = derived(cfg, device, per_epoch)                         # the values computed from others, all here
    mcfg = model_config(cfg, weights=None)                        # the model's shape (a preset or the weights')
"""
import dataclasses
import importlib.util
import math
import os
import shlex
import traceback

import torch

from jreg import WEIGHTINGS
from loss import EARLY_EXIT_SCALES
from model import LlamaConfig, PRESETS


@dataclasses.dataclass(frozen=True)
class Config:
    # run
    out_dir: str = "out/run"         # the run folder: checkpoints, log.jsonl, config.json (a checkpoint there: resume)
    seed: int = 1337                # initialisation and data order
    device: str = "auto"            # auto | cpu | cuda | cuda:N | mps
    dtype: str = "auto"             # auto (bf16 autocast on CUDA, fp32 elsewhere) | bfloat16 | float32
    compile: bool = True            # torch.compile the training step (eval stays eager, but for FSDP's compiled blocks)
    fsdp: bool = False              # FSDP2 (fully_shard) instead of DDP: shards parameters and optimizer state
    fsdp_param_dtype: str = "float32"   # FSDP2 gathers weights in: float32 (as DDP) | bfloat16 (half the bytes)
    activation_checkpointing: bool = False   # recompute each block in the backward pass instead of storing it
    loss_chunk: int = 8192          # positions per chunk of the loss: one chunk's logits live at a time, and each
                                    # chunk adds its head gradient into the sum (fewer chunks: fewer of those passes);
                                    # compiled, let it divide micro_batch · seq_len: a smaller last chunk compiles again
    dist_timeout_min: int = 30      # torch.distributed timeout: ranks wait this long for rank 0's checkpoint write
    # data: token shards of prepare_fineweb.py (pre-training) or conversations of prepare_sft.py (fine-tuning, packed)
    data_dir: str = "data/fineweb_edu"   # a folder of prepare_fineweb.py or prepare_sft.py
    tokenizer: str = "gpt2"         # the shards': gpt2 | bytes | a tiktoken name | hf:NAME_OR_DIR | hf:DIR/FILE.gguf
    # fine-tuning or continued pre-training: the weights to start from (not resumed: a new run), and their shape
    init_from: str = ""             # "" (random) | RUN_DIR (newest ckpt) | RUN_DIR@STEP | RUN_DIR@latest; a Hugging
                                    # Face model: converted first (python -m scripts.convert_hf), then its OUT_DIR
    epochs: float = 0.0             # > 0: max_steps = epochs × windows per epoch / sequences per step (derived)
    warmup_ratio: float = 0.0       # > 0: warmup_steps = warmup_ratio × max_steps (derived); set to 0: no warm-up
    # model: a preset of model.PRESETS. Any field of model.LlamaConfig but max_seq_len (n_layer, d_model, ...) is a
    # setting too (`n_layer = 8`, --d_model=128): it overrides the preset (with init_from it must agree with the
    # weights; None: the preset's); load_config collects them in `shape`, declared once, in model.LlamaConfig
    model: str = "170m"             # a preset of model.PRESETS
    shape: dict = dataclasses.field(default_factory=dict)   # the LlamaConfig fields set, e.g. {"n_layer": 8}
    # batch: batch_tokens per optimizer step = micro_batch · seq_len · world_size · grad_accum
    batch_tokens: int = 524288      # tokens per optimizer step, whatever the number of processes
    micro_batch: int = 16           # sequences per forward on each process (grad_accum is derived)
    seq_len: int = 2048             # tokens per training sequence
    # optimiser and schedule
    max_steps: int = 200000         # optimizer steps
    optimizer: str = "adamw"        # adamw | muon: torch.optim.Muon for the blocks' 2-D matrices (attention and MLP
                                    # projections), AdamW for the embedding, the head, the norms and any scalar
    lr: float = 6e-4                # peak learning rate (AdamW; with Muon, its too: muon_adjust_lr)
    min_lr_ratio: float = 0.1       # cosine decays to lr · min_lr_ratio
    warmup_steps: int = 2000        # linear warm-up, then cosine decay
    weight_decay: float = 0.1       # on ≥ 2-D weights (an untied head too), never on norms
    decay_embeddings: bool = False  # False: none on the token embedding (tied: the shared matrix); True: it decays
    beta1: float = 0.9              # AdamW β1
    beta2: float = 0.95             # AdamW β2
    muon_momentum: float = 0.95     # Muon's momentum (Nesterov), its one buffer per matrix
    muon_adjust_lr: str = "match_rms_adamw"   # Muon's adjust_lr_fn: match_rms_adamw (Moonlight's: lr · 0.2·√max(A, B),
                                    # so that one lr and weight decay serve both) | original (Keller Jordan's √max(1, A/B))
    grad_clip: float = 1.0          # 0: no clipping
    max_bad_steps: int = 5          # non-finite steps in a row skipped (nothing applied); one more stops the run
    # JREG
    jreg_lambda: float = 0.0        # 0 = the baseline, exactly
    jreg_alpha: float = 1.0         # α of the layer weights
    jreg_weighting: str = "index"   # index: softmax(α·l) | depth: softmax(α·l/L) | uniform | last
    jreg_final_norm: bool = False   # h_L = raw residual stream (False) or after the final RMSNorm (True, HF's view)
    jreg_skip_first: bool = False   # leave position 0 out of Ψ
    # another loss term for the last layers (the model's methods are shape settings: model.LlamaConfig)
    early_exit: float = 0.0         # early-exit loss (LayerSkip, arXiv 2404.16710): + w · mean over ℓ < L of
                                    # CE(head(N(h_ℓ)), y), the logit lens trained; 0: off
    early_exit_scale: str = "uniform"   # uniform: as above | sum_l: LayerSkip's Σ_ℓ s_ℓ·CE_ℓ over the exits and h_L,
                                    # s_ℓ ∝ 1 + .. + ℓ, × early_exit below L, Σ s = 1 (torchtune's sum_l_loss_scale)
    early_exit_every: int = 0       # > 0: LayerSkip's rotational curriculum, the exits ℓ < L whose (ℓ − 1 − step)
                                    # mod L is a multiple of it train at a step (torchtune's); 0: every exit, always
    backout_lr_mult: float = 1.0    # Backout's λ trains at lr × this (the modded-nanogpt record's: 5)
    # logging, evaluation, checkpoints
    log_interval: int = 1           # steps between log.jsonl records
    eval_interval: int = 1000       # 0: no periodic evaluation
    eval_batches: int = 20          # fixed validation batches (of micro_batch sequences) per eval
    ckpt_interval: int = 1000       # steps between checkpoints (and always at the end or on SIGTERM)
    keep_ckpts: int = 3             # newest checkpoints kept
    keep_every: int = 0             # > 0: also every checkpoint whose step is a multiple of it, for good
    sharded_ckpt: bool = False      # each rank writes its shard (torch.distributed.checkpoint): ckpt_N/ folders
    async_ckpt: bool = False        # with sharded_ckpt: written in the background while training goes on
    wandb_project: str = ""         # log to Weights & Biases as well (needs wandb)
    wandb_run_name: str = ""        # its run name


# settings that may differ when a run is resumed (recorded in config.json's history); all others must match
RESUMABLE = {"init_from", "max_steps", "epochs", "device", "dtype", "compile", "fsdp", "fsdp_param_dtype",
             "activation_checkpointing", "loss_chunk", "dist_timeout_min", "micro_batch", "lr", "min_lr_ratio",
             "warmup_steps", "warmup_ratio", "grad_clip", "max_bad_steps", "log_interval", "eval_interval",
             "eval_batches", "ckpt_interval", "keep_ckpts", "keep_every", "sharded_ckpt", "async_ckpt",
             "wandb_project", "wandb_run_name"}
# the value a checkpoint written before a setting existed was trained with, where that is not today's default
BEFORE = {"decay_embeddings": True}


def usage():
    """--help: Config and model.LlamaConfig as declared, each setting's default and meaning on its line."""
    import inspect
    return "\n".join([
        "usage: python train.py [CONFIG.py ...] [--key=value ...]   (torchrun ... train.py for several processes)",
        "settings (defaults <- config files, in order <- the command line), as config.Config declares them:",
        *inspect.getsource(Config).splitlines()[2:],
        "the model's shape: these fields of model.LlamaConfig (shown: its defaults; unset: the preset's), e.g. --n_layer=8:",
        *(line for line in inspect.getsource(LlamaConfig).splitlines()[2:] if line.split(":")[0].strip() in SHAPE),
        f"a resumed run may change (the others must match): {', '.join(sorted(RESUMABLE))}"])


def fail(message):
    raise SystemExit(f"error: {message}")


def read_config_file(path):
    """The settings a config file assigns. `include("other.py")` inside it first reads another file of the same
    folder, so a JREG config can be its baseline plus the lines that differ."""
    if not os.path.isfile(path):
        fail(f"config file {path!r} does not exist")
    ns = {"include": lambda name: ns.update(read_config_file(os.path.join(os.path.dirname(path), name)))}
    try:
        exec(compile(open(path).read(), path, "exec"), ns)
    except Exception as e:                                       # name the file and line of the mistake
        line = e.lineno if isinstance(e, SyntaxError) else next(
            (f.lineno for f in reversed(traceback.extract_tb(e.__traceback__)) if f.filename == path), "?")
        fail(f"{path}, line {line}: {type(e).__name__}: {e}")
    return {k: v for k, v in ns.items() if not (k.startswith("_") or k == "include" or callable(v)
                                                or type(v).__name__ == "module")}


SHAPE = {f.name: f.type for f in dataclasses.fields(LlamaConfig) if f.name != "max_seq_len"}   # cfg.shape's keys
SETS = {"epochs": "max_steps", "warmup_ratio": "warmup_steps"}          # the first, when > 0, sets the second
PAIRED = {**SETS, **{second: first for first, second in SETS.items()}}


def parse(text, ftype):
    """--key=text as the setting's type: bool from true / false, int also from 1e6; text that is none stays text (a
    wrong type, reported by load_config)."""
    try:
        if ftype is bool:
            return {"true": True, "false": False}[text.lower()]
        if ftype is int and not text.strip().lstrip("+-").isdigit():
            return int(float(text)) if float(text).is_integer() else text
        return ftype(text)
    except (KeyError, ValueError):
        return text


def load_config(argv):
    """Config from `[config.py ...] [--key=value ...]`: defaults <- each config file and --key=value in turn; then
    checked. Setting one of a pair (SETS: epochs or max_steps, warmup_ratio or warmup_steps) drops an earlier
    setting of the other; a config file that sets both is an error. The shape's fields go into cfg.shape."""
    types = {**{f.name: f.type for f in dataclasses.fields(Config) if f.name != "shape"}, **SHAPE}
    values, where = {}, {}
    for arg in argv:
        if arg.startswith("--"):
            key, sep, text = arg[2:].partition("=")
            if not sep:
                fail(f"config key {key!r}: use --{key}=VALUE")
            layer, source = {key: parse(text, types.get(key, str))}, "(from the command line)"
        else:
            layer, source = read_config_file(arg), f"in {arg}"
        if isinstance(layer.get("shape"), dict):        # a resolved config (config.json's) writes the shape as a dict
            layer = {**{k: v for k, v in layer.items() if k != "shape"}, **layer["shape"]}
        for key in layer:
            if PAIRED.get(key) not in layer:
                values.pop(PAIRED.get(key), None)
        values.update(layer)
        where.update(dict.fromkeys(layer, source))
    for key, value in values.items():
        ftype = types.get(key) or fail(f"unknown config key {key!r} {where[key]}")
        if ftype is float and type(value) is int:
            values[key] = value = float(value)
        if type(value) is not ftype and not (value is None and key in SHAPE):      # None: the preset's
            fail(f"config key {key!r}: expected {ftype.__name__}, got {type(value).__name__} {value!r} {where[key]}")
    for key, other in SETS.items():
        if values.get(key) and other in values:
            fail(f"{key} = {values[key]} sets {other}, which is set too ({values[other]}): set one of them")
    if values.get("warmup_ratio", 1) == 0 and "warmup_steps" not in values:
        values["warmup_steps"] = 0                    # warmup_ratio = 0 asked for: no warm-up, not the default 2,000
    shape = {key: values.pop(key) for key in list(values) if key in SHAPE}
    cfg = Config(**values, shape={key: value for key, value in shape.items() if value is not None})
    check_config(cfg)
    return cfg


MIN_TORCH = "2.6"   # the oldest torch with every API used (docs/training.md lists them): fully_shard's public path


def check_torch(version=torch.__version__):
    if torch.torch_version.Version(version).release[:2] < tuple(map(int, MIN_TORCH.split("."))):  # 2.6 nightlies too
        fail(f"torch {version} is older than {MIN_TORCH}, the oldest this project supports: pip install 'torch>={MIN_TORCH}'")


def check_config(cfg):
    """Every setting in range, before anything is built or written."""
    check_torch()
    def need(ok, key, what):
        if not ok:
            fail(f"config key {key!r} = {getattr(cfg, key)!r}: {what}")
    for key in ("batch_tokens", "micro_batch", "seq_len", "log_interval", "eval_batches", "ckpt_interval",
                "keep_ckpts", "max_steps", "dist_timeout_min", "loss_chunk"):
        need(getattr(cfg, key) >= 1, key, "must be at least 1")
    for key in ("seed", "warmup_steps", "eval_interval", "max_bad_steps", "keep_every"):
        need(getattr(cfg, key) >= 0, key, "must be 0 or more")
    need(cfg.seed < 2 ** 63, "seed", "must be below 2**63 (torch's seed)")
    for key in ("lr", "weight_decay", "grad_clip", "jreg_lambda", "jreg_alpha", "epochs", "warmup_ratio", "early_exit",
                "backout_lr_mult", "early_exit_every"):
        need(math.isfinite(getattr(cfg, key)) and getattr(cfg, key) >= 0, key, "must be a finite number >= 0")
    need(cfg.warmup_ratio <= 1, "warmup_ratio", "is the fraction of max_steps spent warming up: 0 to 1")
    need(0 <= cfg.min_lr_ratio <= 1, "min_lr_ratio", "must be in [0, 1]")
    for key in ("beta1", "beta2"):
        need(0 <= getattr(cfg, key) < 1, key, "must be in [0, 1) (AdamW's)")
    need(cfg.dist_timeout_min <= 10 ** 9, "dist_timeout_min", "must be at most 10**9")
    need(cfg.seq_len >= 2 or not cfg.jreg_skip_first, "jreg_skip_first", "leaves Ψ no token of a 1-token window: "
         "use seq_len >= 2 or jreg_skip_first=False")
    need(cfg.model in PRESETS, "model", f"choose one of {sorted(PRESETS)}")
    need(cfg.jreg_weighting in WEIGHTINGS, "jreg_weighting", f"choose one of {WEIGHTINGS}")
    need(cfg.early_exit_scale in EARLY_EXIT_SCALES, "early_exit_scale", f"choose one of {EARLY_EXIT_SCALES}")
    need(cfg.optimizer in ("adamw", "muon"), "optimizer", "choose adamw or muon")
    need(cfg.optimizer != "muon" or hasattr(torch.optim, "Muon"), "optimizer", "muon is torch.optim.Muon, which "
         f"torch 2.9 added; this torch is {torch.__version__}: pip install 'torch>=2.9'")
    need(cfg.optimizer != "muon" or not cfg.fsdp, "optimizer", "muon under FSDP is not supported here (its "
         "Newton-Schulz step needs each whole matrix, FSDP holds a shard): use DDP (fsdp=False)")
    need(cfg.muon_adjust_lr in ("match_rms_adamw", "original"), "muon_adjust_lr", "choose match_rms_adamw or original")
    need(0 <= cfg.muon_momentum < 1, "muon_momentum", "must be in [0, 1)")
    for key, default in (("early_exit_scale", "uniform"), ("early_exit_every", 0)):
        need(cfg.early_exit or getattr(cfg, key) == default, key, "shapes the early-exit loss, which is off: set "
             "early_exit > 0 too")
    need(cfg.dtype in ("auto", "bfloat16", "float32"), "dtype", "choose auto, bfloat16 or float32")
    need(cfg.fsdp_param_dtype in ("bfloat16", "float32"), "fsdp_param_dtype", "choose bfloat16 or float32")
    need(cfg.sharded_ckpt or not cfg.async_ckpt, "async_ckpt", "needs sharded_ckpt=True")
    need(not cfg.wandb_project or importlib.util.find_spec("wandb"), "wandb_project", "needs wandb: pip install wandb")
    need(not cfg.init_from.startswith("hf:"), "init_from", "training reads only its own checkpoints: convert the "
         f"model once with python -m scripts.convert_hf {shlex.quote(cfg.init_from)} OUT_DIR --tokenizer "
         f"{shlex.quote(cfg.tokenizer)} and set init_from=OUT_DIR")
    if cfg.device != "auto":
        try:
            device = torch.device(cfg.device)
        except RuntimeError:
            fail(f"config key 'device' = {cfg.device!r}: not a device (cpu, cuda, cuda:N, mps)")
        need(device.type != "cuda" or torch.cuda.is_available(), "device", "CUDA is not available here")
        need(device.type != "mps" or torch.backends.mps.is_available(), "device", "MPS is not available here")
        need(device.type in ("cpu", "cuda", "mps"), "device", "choose cpu, cuda, cuda:N or mps")
    if not cfg.init_from:
        model_config(cfg)


def derived(cfg, device, per_epoch):
    """The settings computed from others, all here, once (the run records them as they ran): device, the process's own
    (parallel.place); max_steps from epochs (> 0) and the windows per epoch; warmup_steps from warmup_ratio (> 0)."""
    max_steps = max(1, math.ceil(cfg.epochs * per_epoch / (cfg.batch_tokens // cfg.seq_len))) if cfg.epochs else \
        cfg.max_steps
    warmup_steps = round(cfg.warmup_ratio * max_steps) if cfg.warmup_ratio else cfg.warmup_steps
    return dataclasses.replace(cfg, device=str(device), max_steps=max_steps, warmup_steps=warmup_steps)


def model_config(cfg, weights=None):
    """The model's shape: the preset (or `weights`, the LlamaConfig of the weights init_from starts from) with
    cfg.shape over it, and max_seq_len at least seq_len; a size not > 0 or a shape LlamaConfig refuses is one error
    line."""
    base = PRESETS[cfg.model] if weights is None else weights
    for key, value in cfg.shape.items():                          # a size; a method's 0 is off
        if type(value) is not bool and getattr(LlamaConfig, key) > 0 and not value > 0:
            fail(f"config key {key!r} = {value}: must be > 0")
    try:
        mcfg = dataclasses.replace(base, **cfg.shape, max_seq_len=max(cfg.seq_len, base.max_seq_len))
    except ValueError as e:                                       # LlamaConfig's checks, each one line
        fail(f"model shape: {e}")
    if cfg.backout_lr_mult != 1 and not mcfg.backout_layer:
        fail(f"config key 'backout_lr_mult' = {cfg.backout_lr_mult!r}: is Backout's λ's, and Backout is off: set "
             "backout_layer too")
    if cfg.early_exit and mcfg.n_layer < 2:
        fail(f"config key 'early_exit' = {cfg.early_exit!r}: the early-exit loss reads the layers below the last, and "
             f"a model of n_layer = {mcfg.n_layer} has none: use n_layer >= 2 or early_exit=0")
    return mcfg
