"""Export a checkpoint of a run folder as a Hugging Face Llama folder that transformers, vLLM, lm-evaluation-harness,
`transformers serve` or the hub load as it is.

    python -m scripts.export out/kjv_jreg hf/kjv_jreg                    # the latest checkpoint, fp32
    python -m scripts.export out/kjv_jreg hf/kjv_jreg --step 600 --dtype bfloat16    # or out/kjv_jreg@600
    python -m scripts.export out/kjv_jreg hf/kjv_jreg --overwrite         # replace an existing, non-empty OUT

OUT: the weights and config (lib.hf.llama_to_hf), a fast byte-level BPE tokenizer built from the run's tiktoken ranks
(or the run's own Hugging Face tokenizer, as it was) with our chat template as Jinja, and jreg.json (the source run and
its JREG settings); written to a temporary folder, then renamed. The tokenizer encodes like tiktoken except that the
newline ending a role header is always a token boundary, as our template encodes it: docs/export.md.
"""
import argparse
import copy
import json
import os
import re
import shutil
import sys

import torch
from safetensors import SafetensorError

from lib.conversations import HEADERS, chat_template, prompt_ids, render
from files import one_line
from lib.hf import cannot_write, check_vocabulary, llama_to_hf
from lib.commands import check_writable, load_run
from checkpoint import run_step
from tokenizer import EOT, HFTokenizer, tokenizer_tag


# conversations.render's chat template: EOT, then each turn's header and content; EOT closes each
# assistant turn, "\n" separates turns; a generation prompt ends with the assistant header
CHAT_TEMPLATE = (
    "{{ eos_token }}{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('unknown role ' + m['role']) }}"
    "{% endif %}{{ '<|' + m['role'] + '|>\\n' + m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% if not loop.last %}{{ '\\n' }}{% endif %}"
    "{% else %}{{ '\\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "\n\n  Hi, 'you'!"},
        {"role": "assistant", "content": "  Hello.\n"}, {"role": "user", "content": "\tMore?  "}]
SAMPLE = ("Hello, World! It's 1,234,567 o'clock; we'LL see... Ünïcödé, 日本語, ﷺ, 🙂🙂\r\n\ttabs\t\t  and"
          "   spaces  \n\n\n  indented\n<|endoftext|>  ")


def add_chat_template(tok, enc):
    """tok (a fast tokenizer) with our chat template, the newline ending a role header made a token boundary (as
    render encodes header and content apart), if apply_chat_template then gives render's and prompt_ids' ids on a
    sample chat; else None."""
    from tokenizers import Regex, pre_tokenizers
    headers = "|".join(re.escape(h[:-1]) for h in HEADERS.values())      # each header ends with "\n"
    backend = tok.backend_tokenizer
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(f"(?<={headers})\\n"), behavior="isolated"), backend.pre_tokenizer])
    tok.chat_template = CHAT_TEMPLATE
    same = tok.apply_chat_template(CHAT, add_generation_prompt=True, return_dict=False) == prompt_ids(CHAT, enc)
    return tok if same and tok.apply_chat_template(CHAT[:3], return_dict=False) == render(CHAT[:3], enc)[0] else None


def hf_tokenizer(enc, max_length=None):
    """A transformers fast tokenizer (byte-level BPE, TikTokenConverter's vocabulary and merges) that encodes and
    decodes like the tiktoken Encoding `enc` (but for role headers' newlines), with the chat template; SystemExit if
    not."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter
    if enc.eot_token is None or enc.decode([enc.eot_token]) != EOT:
        raise SystemExit(f"error: tokenizer {enc.name!r} has no {EOT} token, which the export uses as BOS/EOS")
    try:
        conv = TikTokenConverter(pattern=enc._pat_str)
        conv.load_tiktoken_bpe = lambda _: enc._mergeable_ranks
        vocab, merges = conv.extract_vocab_merges_from_model(None)
        tk = Tokenizer(models.BPE({**vocab, **enc._special_tokens}, merges, fuse_unk=False, ignore_merges=True))
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(enc._pat_str), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tk.decoder, tk.post_processor = decoders.ByteLevel(), processors.ByteLevel(trim_offsets=False)
        tk.add_special_tokens([AddedToken(s, normalized=False, special=True) for s in enc._special_tokens])
        tok = add_chat_template(PreTrainedTokenizerFast(
            tokenizer_object=tk, bos_token=EOT, eos_token=EOT, pad_token=EOT, clean_up_tokenization_spaces=False,
            **({"model_max_length": max_length} if max_length else {})), enc)
        ids = enc.encode(SAMPLE, allowed_special="all")
        same = tok is not None and tok.encode(SAMPLE) == ids and tok.decode(ids) == SAMPLE
    except Exception as e:
        raise SystemExit(f"error: tokenizer {enc.name!r} does not convert to a Hugging Face tokenizer: "
                         f"{one_line(e)}") from None
    if not same:
        raise SystemExit(f"error: tokenizer {enc.name!r}: the converted Hugging Face tokenizer does not encode "
                         "like tiktoken (checked on a sample text and conversation); it cannot be exported")
    return tok


def export(run_dir, out, step=None, dtype="float32", overwrite=False):
    """Write the Hugging Face folder `out` for the checkpoint `step` (default: the latest) of `run_dir`."""
    from transformers import GenerationConfig
    run_dir, step = run_step(run_dir, step)                        # RUN_DIR@STEP, as everywhere
    if not os.path.isdir(run_dir):
        raise SystemExit(f"error: run folder not found: {run_dir}")
    real = os.path.realpath(out)                    # a link: its target is replaced, the link stays
    for held, path in ((f"the run folder {run_dir}", run_dir), ("the current folder", os.curdir)):
        if os.path.commonpath([real, os.path.realpath(path)]) == real:
            raise SystemExit(f"error: the output folder {out} holds {held}")
    tmp, old = (os.path.join(os.path.dirname(real), f".{os.path.basename(real)}.{kind}") for kind in ("tmp", "old"))
    if os.path.isdir(old) and not os.path.exists(real):        # an export killed between its two renames (below):
        os.replace(old, real)                                   # the folder before it comes back
    if os.path.exists(out) and not os.path.isdir(out):
        raise SystemExit(f"error: {out} is not a folder")
    if os.path.exists(out) and os.listdir(out) and not overwrite:
        raise SystemExit(f"error: {out} exists and is not empty (--overwrite replaces it)")
    out = real
    check_writable(os.path.dirname(out), "OUT's folder", folder=True)
    model, enc, meta = load_run(run_dir, step)
    check_vocabulary(model.config.vocab_size, enc)
    hf = llama_to_hf(model)                      # every weight mapped, or refused before the tokenizer is built
    own = isinstance(enc, HFTokenizer)           # a model's own tokenizer (e.g. a retrofit): written back as it was
    tok = enc.hf if own else hf_tokenizer(enc, model.config.max_seq_len)
    if own and chat_template(enc) is None:       # it chats in our template (conversations.chat_prompt): ours goes too
        tok = add_chat_template(copy.deepcopy(tok), enc) or tok
        if tok.chat_template is None:
            print(f"warning: our chat template does not render in tokenizer {enc.name!r} as conversations.render "
                  "does; the folder has no chat template", file=sys.stderr)
    with torch.no_grad():                        # an edited model.py (an ablation) is no longer the Llama that HF runs
        x = (torch.arange(min(32, model.config.max_seq_len)) * 7919 % min(enc.n_vocab, model.config.vocab_size))[None]
        ours, theirs = model(x).logits, hf(x).logits
    if not torch.allclose(ours, theirs, rtol=1e-3, atol=1e-3 * max(1.0, ours.abs().max().item())):
        raise SystemExit(f"error: transformers' Llama with these weights does not give this model's logits (max |Δ| "
                         f"{(ours - theirs).abs().max().item():.2g}): model.py is no standard Llama; nothing written")
    hf = hf.to(getattr(torch, dtype))            # checked in fp32, written in dtype
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id,
           "pad_token_id": tok.eos_token_id if tok.pad_token_id is None else tok.pad_token_id}
    hf.config.update(ids)
    hf.generation_config = GenerationConfig(**ids)
    cfg = meta["config"]
    provenance = {"source": os.path.abspath(run_dir), "checkpoint": os.path.basename(meta["checkpoint"]),
                  "step": meta["step"], "tokens": meta["tokens"], "tokenizer": tokenizer_tag(enc), "dtype": dtype,
                  "init_from": cfg.get("init_from", ""), "data_dir": cfg.get("data_dir"),
                  "jreg": {k: v for k, v in cfg.items() if k.startswith("jreg_")},
                  # what else the model was trained with: the early-exit loss's weight (absent: a run from before the
                  # setting, or a conversion: off) and LayerNorm Scaling (folded into the norm gains of this folder)
                  "early_exit": cfg.get("early_exit", 0.0), "layernorm_scaling": model.config.layernorm_scaling}
    for path in (tmp, old):                          # what a killed export left
        shutil.rmtree(path, ignore_errors=True)
    try:
        os.makedirs(tmp)
        hf.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        # also for readers on transformers 4.x: the tokenizer's class, the template and two settings under older keys
        for file, fields in (("tokenizer_config.json", {"chat_template": tok.chat_template}),
                             ("config.json", {"rope_theta": model.config.rope_theta, "torch_dtype": dtype}),
                             ("jreg.json", provenance)):
            path = os.path.join(tmp, file)
            fields = {**(json.load(open(path)) if os.path.exists(path) else {}), **fields}
            if fields.get("tokenizer_class") == "TokenizersBackend":      # transformers 5's name of a fast tokenizer
                fields["tokenizer_class"] = "PreTrainedTokenizerFast"
            with open(path, "w") as f:
                json.dump(fields, f, indent=2)
        umask = os.umask(0o22)
        os.umask(umask)
        for file in os.listdir(tmp):                                    # save_pretrained's files can be private
            os.chmod(os.path.join(tmp, file), 0o666 & ~umask)
        if os.path.exists(out):
            os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    except (OSError, RuntimeError, SafetensorError) as e:    # a full disk: safetensors' own error, or an OSError
        if os.path.isdir(old) and not os.path.exists(out):     # the folder before it stays
            os.replace(old, out)
        cannot_write(out, e)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("run_dir", help="a run folder of train.py, or RUN_DIR@STEP")
    p.add_argument("out", help="the Hugging Face folder to write (must not exist or be empty, unless --overwrite)")
    p.add_argument("--step", type=int, default=None, help="the checkpoint's step (default: the latest)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="the weights' dtype")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    args = p.parse_args(argv)
    out = export(args.run_dir, args.out, args.step, args.dtype, args.overwrite)
    print(f"wrote {out}: {', '.join(sorted(os.listdir(out)))}")


if __name__ == "__main__":
    sys.exit(main())
