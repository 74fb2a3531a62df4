# What packing does to the fine-tuned model's loss (README, "Fine-tuning at small scale"): the assistant-token loss
# on the val conversations packed into windows as in training (a conversation attends to the ones before it in its
# window, its positions continue theirs) vs each conversation alone (positions from 0, nothing before it). The same
# target tokens either way; a conversation that opens its window sees the same input both ways (a check).
#   python results/sft_kjv/packing_effect.py RUN_DIR SEQ_LEN OUT.json DATA_DIR ... [-- COMMAND ...]   (one CPU thread)
import json, os, platform, sys
import numpy as np, torch, torch.nn.functional as F
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from data import PackedStream, read_manifest  # noqa: E402
from lib.commands import load_run  # noqa: E402
torch.set_num_threads(1)
run_dir, seq_len, out, *rest = sys.argv[1:]
cut = rest.index("--") if "--" in rest else len(rest)
data_dirs, commands, seq_len = rest[:cut], rest[cut + 1:], int(seq_len)
model, enc, meta = load_run(run_dir)


def losses(x, y):  # the cross-entropy of every target, 0 where y = -1
    with torch.no_grad():
        return F.cross_entropy(model(x).logits.float().transpose(1, 2), y, ignore_index=-1, reduction="none")


def mean(d, convs):
    return sum(d[c][0] for c in convs) / sum(d[c][1] for c in convs)


def measure(data_dir):
    s = PackedStream(data_dir, "val", seq_len, 0, enc.name, model.config.vocab_size)
    packed, alone, first = {}, {}, set()  # conversation -> (sum of losses, targets)
    for k in range(0, s.per_epoch, 16):
        x, y, _ = s.batch(k, min(16, s.per_epoch - k))
        for row, loss in enumerate(losses(x, y)):
            window, pos = s.windows[k + row], 0
            first.add(int(window[0]))
            for c in window:  # the conversation's tokens are pos .. pos+n-1, its targets y[pos .. pos+n-2]
                n = int(s.lengths[c])
                packed[int(c)] = (float(loss[pos:pos + n - 1].sum()), int((y[row, pos:pos + n - 1] >= 0).sum()))
                pos += n
    order = sorted(packed)
    for i in range(0, len(order), 16):
        convs = order[i:i + 16]
        T = max(int(s.lengths[c]) for c in convs) - 1
        x, y = torch.zeros(len(convs), T, dtype=torch.long), torch.full((len(convs), T), -1)
        for row, c in enumerate(convs):
            tokens = np.asarray(s.tokens[s.where[c]][s.starts[c]:s.starts[c] + s.lengths[c]], np.int64)
            mask = np.asarray(s.masks[s.where[c]][s.starts[c]:s.starts[c] + s.lengths[c]]) == 1
            x[row, :len(tokens) - 1] = torch.from_numpy(tokens[:-1])
            y[row, :len(tokens) - 1] = torch.from_numpy(np.where(mask[1:], tokens[1:], -1))
        for row, (c, loss) in enumerate(zip(convs, losses(x, y))):
            alone[c] = (float(loss.sum()), int((y[row] >= 0).sum()))
    later = [c for c in order if c not in first]
    assert all(packed[c][1] == alone[c][1] for c in order)
    train = PackedStream(data_dir, "train", seq_len, meta["config"]["seed"], enc.name, model.config.vocab_size)
    return {"data": data_dir, "prepared_seq_len": read_manifest(data_dir)["config"]["seq_len"],
            "train_conversations": len(train.lengths), "train_windows": train.per_epoch,
            "val_conversations": len(order), "windows": s.per_epoch, "target_tokens": sum(packed[c][1] for c in order),
            "loss_packed": round(mean(packed, order), 4), "loss_alone": round(mean(alone, order), 4),
            "difference_packed_minus_alone": round(mean(packed, order) - mean(alone, order), 4),
            "later_in_window": {"conversations": len(later), "target_tokens": sum(packed[c][1] for c in later),
                                "loss_packed": round(mean(packed, later), 4),
                                "loss_alone": round(mean(alone, later), 4)},
            "first_in_window": {"conversations": len(first), "max_abs_difference_of_sums":
                                max(abs(packed[c][0] - alone[c][0]) for c in first)}}


cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
           platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
result = {
    "run": run_dir, "step": meta["step"], "seq_len": seq_len, "measurements": [measure(d) for d in data_dirs],
    "cpu": cpu, "torch": torch.__version__, "threads": torch.get_num_threads(),
    "note": "fp32 on CPU; the last digits depend on the CPU's kernels",
    "commands": commands + ["python " + " ".join(sys.argv[:len(data_dirs) + 4])]}
json.dump(result, open(out, "w"), indent=1)
print(json.dumps(result, indent=1))
