"""Mini-cram: a fixed wall-clock budget on the bundled sample corpus, and the same tokens through Hugging Face BERT.

    python bench/bench_cram.py                     # 5 CPU minutes, a 4 x 128 model, vocab 4096
    python bench/bench_cram.py --minutes 2 --out runs/mini_cram

1. train.py runs our recipe (crammed-BERT block, sparse MLM, budget triangle, batch ramp) for --minutes of wall
   clock and logs the held-out MLM loss at every tenth of the budget.
2. Hugging Face `BertForMaskedLM` of the same depth, width, heads and vocabulary (post-LN, learned positions,
   4d feed-forward, dense MLM head: the usual BERT) trains on the same tokenizer, the same batch stream and
   masks, and the same number of tokens, with the usual BERT recipe (AdamW lr 1e-4, 10% warm-up then linear
   decay, weight decay 0.01), evaluated on the same held-out batches at the same token counts.
The table compares held-out loss at equal tokens and at equal time. Record the printed curve in the README so
later changes can be compared against it. Needs `pip install transformers` (benchmark only).
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import data  # noqa: E402
import model  # noqa: E402
import train  # noqa: E402
from bench_model import hf_bert  # noqa: E402  (bench/ is on sys.path as the script's folder)


def run_ours(args):
    out = os.path.join(args.out, "ours")
    if os.path.exists(os.path.join(out, "checkpoint.pt")):
        os.remove(os.path.join(out, "checkpoint.pt"))
    summary = train.main(["--data", "sample", "--cache", args.cache, "--vocab-size", str(args.vocab_size),
                          "--model", args.preset, "--n-layers", str(args.n_layers), "--d-model", str(args.d_model),
                          "--n-heads", str(args.n_heads), "--ffn-dim", str(args.ffn_dim),
                          "--seq-len", str(args.seq_len), "--micro-batch", str(args.micro_batch),
                          "--batch-tokens", str(args.batch_tokens), "--minutes", str(args.minutes),
                          "--eval-batches", str(args.eval_batches), "--seed", str(args.seed), "--out", out,
                          "--log-every", "20", "--checkpoint-minutes", "1000"])
    with open(os.path.join(out, "log.jsonl")) as f:
        evals = [r for r in map(json.loads, f) if r["kind"] == "eval"]
    curve = [(r["tokens"], r["elapsed"], r["val_loss"]) for r in evals]
    return summary, [point for i, point in enumerate(curve) if i == 0 or point[0] > curve[i - 1][0]]


def dense_labels(batch):
    """Our sparse (B, k) labels at (B, k) positions -> the (B, T) labels with -100 elsewhere that HF expects."""
    labels = torch.full_like(batch["input_ids"], -100)
    return labels.scatter(1, batch["label_positions"], batch["labels"])


@torch.no_grad()
def hf_eval(net, meta, args):
    """Same held-out batches as train.evaluate: the val split in order, seed 1234."""
    loader = data.make_loader(meta, "val", "mlm", seed=1234, mask_rate=0.25)
    net.eval()
    total = 0.0
    for _ in range(args.eval_batches):
        b = loader.next_batch(args.micro_batch, args.seq_len)
        total += net(input_ids=b["input_ids"], labels=dense_labels(b)).loss.item()
    net.train()
    return total / args.eval_batches


def run_hf(args, meta, cfg, token_marks):
    """Train HF BERT on the same batch stream up to the last token mark, evaluating at every mark."""
    torch.manual_seed(args.seed)
    net = hf_bert(cfg, dropout=0.1).train()  # BERT's usual dropout
    loader = data.make_loader(meta, "train", "mlm", seed=args.seed, mask_rate=0.25)
    total_tokens = token_marks[-1]
    micro_tokens = args.micro_batch * args.seq_len
    accum = max(1, round(args.batch_tokens / micro_tokens))
    total_steps = max(1, total_tokens // (accum * micro_tokens))
    decay = [p for n, p in net.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in net.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.999), eps=1e-6)
    warmup = max(1, int(0.1 * total_steps))
    curve, tokens, step, marks = [], 0, 0, list(token_marks)
    t0 = time.time()
    while tokens < total_tokens:
        lr = 1e-4 * min((step + 1) / warmup, max(0.0, (total_steps - step) / (total_steps - warmup)))
        for g in opt.param_groups:
            g["lr"] = lr
        for _ in range(accum):
            b = loader.next_batch(args.micro_batch, args.seq_len)
            (net(input_ids=b["input_ids"], labels=dense_labels(b)).loss / accum).backward()
            tokens += micro_tokens
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        while marks and tokens >= marks[0]:
            curve.append((tokens, time.time() - t0, hf_eval(net, meta, args)))
            print(f"  HF BERT  {tokens:>10,} tokens  {curve[-1][1]:7.1f} s  held-out loss {curve[-1][2]:.3f}")
            marks.pop(0)
    return curve


def loss_at_time(curve, t):
    """Held-out loss of the last evaluation at or before time t (None if none)."""
    done = [loss for _, elapsed, loss in curve if elapsed <= t + 1e-9]
    return done[-1] if done else None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=5.0, help="wall-clock budget of our run in minutes")
    p.add_argument("--preset", default="mini", help="model preset whose other settings are used")
    p.add_argument("--n-layers", type=int, default=4, help="layers")
    p.add_argument("--d-model", type=int, default=128, help="hidden size")
    p.add_argument("--n-heads", type=int, default=4, help="attention heads")
    p.add_argument("--ffn-dim", type=int, default=256, help="feed-forward width after gating (HF BERT gets 4 x d_model)")
    p.add_argument("--vocab-size", type=int, default=4096, help="tokenizer vocabulary trained on the sample")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per sequence")
    p.add_argument("--micro-batch", type=int, default=32, help="sequences per forward pass")
    p.add_argument("--batch-tokens", type=int, default=16384, help="target tokens per optimizer step")
    p.add_argument("--eval-batches", type=int, default=10, help="held-out batches per evaluation")
    p.add_argument("--seed", type=int, default=0, help="seed of both runs")
    p.add_argument("--skip-hf", action="store_true", help="run only our recipe")
    p.add_argument("--cache", default="cache", help="data cache folder")
    p.add_argument("--out", default="runs/mini_cram", help="output folder (results.json)")
    args = p.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    summary, ours = run_ours(args)
    result = {"args": vars(args), "ours": ours, "ours_summary": summary}
    if not args.skip_hf:
        meta = data.prepare_data("sample", args.cache, args.vocab_size, progress=False)
        cfg = model.load_model(os.path.join(args.out, "ours", "final")).config
        print(f"Hugging Face BertForMaskedLM on the same {ours[-1][0]:,} tokens:")
        result["hf"] = run_hf(args, meta, cfg, [t for t, _, _ in ours])
    print(f"\nmini-cram: {args.n_layers} x {args.d_model}, {args.minutes} min budget for ours, sample corpus, "
          f"vocab {args.vocab_size}")
    print(f"{'tokens':>12} | {'ours s':>7} {'ours loss':>9} | {'HF s':>7} {'HF loss':>8}")
    for i, (tokens, t, loss) in enumerate(ours):
        hf = result.get("hf", [])
        row = f"{tokens:>12,} | {t:7.1f} {loss:9.3f} |"
        if i < len(hf):
            row += f" {hf[i][1]:7.1f} {hf[i][2]:8.3f}"
        print(row)
    if result.get("hf"):
        t_end, loss_end = ours[-1][1], ours[-1][2]
        hf_at_t = loss_at_time(result["hf"], t_end)
        result["equal_tokens"] = {"ours": loss_end, "hf": result["hf"][-1][2]}
        result["equal_time"] = {"seconds": t_end, "ours": loss_end, "hf": hf_at_t}
        print(f"equal tokens ({ours[-1][0]:,}): ours {loss_end:.3f} vs HF {result['hf'][-1][2]:.3f}; "
              f"time ours {t_end:.0f} s vs HF {result['hf'][-1][1]:.0f} s")
        print(f"equal time ({t_end:.0f} s): ours {loss_end:.3f} vs HF "
              f"{'no evaluation yet' if hf_at_t is None else f'{hf_at_t:.3f}'}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
