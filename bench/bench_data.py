"""Benchmark data.py on the bundled sample corpus, side by side with Hugging Face `tokenizers`, in one run.

    python bench/bench_data.py                       # vocab 8192, batch 32 x 128, CPU
    python bench/bench_data.py --vocab-size 32768 --device cuda

Reports, each with a ratio (absolute times depend on the machine and its load; the ratios travel better):
1. tokenizer training time: rustbpe (data.train_tokenizer) vs tokenizers' BPE trainer (byte-level, same split
   pattern, same vocabulary size);
2. encoding throughput in MB/s of UTF-8 text: tiktoken vs tokenizers, batch (all threads) and one thread;
3. the loader's cost as a fraction of a training step (fwd + bwd + AdamW of model.py's "mini" preset, MLM):
   next_batch's time on the critical path, with prefetch (default) and without.
Results are printed and written as JSON (--out).
"""
import argparse
import json
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import data  # noqa: E402
import model  # noqa: E402


def timed(fn, repeat=1):
    """Best wall time of `repeat` calls (the minimum is the least noisy estimate on a shared machine)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def hf_bpe(docs, vocab_size):
    """tokenizers' byte-level BPE configured like ours: same split regex, byte alphabet, 8 special tokens."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(data.SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    specials = data.SPECIAL_TOKENS + [f"[RESERVED_{i}]" for i in range(data.MIN_RESERVED)]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, min_frequency=0,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer)
    return tok


def bench_tokenizers(docs, vocab_size, repeat):
    mb = sum(len(d.encode("utf-8")) for d in docs) / 1e6
    t_ours, enc = timed(lambda: data.train_tokenizer(docs, vocab_size), repeat)
    t_hf, hf = timed(lambda: hf_bpe(docs, vocab_size), repeat)
    threads = os.cpu_count() or 1
    e_ours, ids = timed(lambda: enc.encode_ordinary_batch(docs, num_threads=threads), repeat)
    e_hf, _ = timed(lambda: hf.encode_batch(docs, add_special_tokens=False), repeat)
    s_ours, _ = timed(lambda: [enc.encode_ordinary(d) for d in docs], repeat)
    s_hf, _ = timed(lambda: [hf.encode(d, add_special_tokens=False) for d in docs], repeat)
    return {"corpus_mb": mb, "vocab_size": vocab_size, "n_vocab_ours": enc.n_vocab,
            "n_vocab_hf": hf.get_vocab_size(), "bytes_per_token_ours": mb * 1e6 / sum(map(len, ids)),
            "train_s_rustbpe": t_ours, "train_s_hf": t_hf, "train_speedup": t_hf / t_ours,
            "encode_mbps_tiktoken_batch": mb / e_ours, "encode_mbps_hf_batch": mb / e_hf,
            "encode_speedup_batch": e_hf / e_ours, "encode_threads": threads,
            "encode_mbps_tiktoken_1thread": mb / s_ours, "encode_mbps_hf_1thread": mb / s_hf,
            "encode_speedup_1thread": s_hf / s_ours}


def build_step(n_vocab, seq_len, device):
    """(description, step(batch)) for one training step: fwd + bwd + AdamW."""
    net = model.build_model(model.make_config("mini", vocab_size=n_vocab, max_seq_len=seq_len)).to(device)
    desc = "model.py 'mini' (4 layers, d 256), sparse MLM"
    forward = lambda b: net(b["input_ids"], labels=b["labels"], label_positions=b["label_positions"])["loss"]  # noqa: E731
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)

    def step(batch):
        loss = forward(batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()  # a host sync point, as a logging training loop has
    return desc, step


def bench_loader(meta, batch_size, seq_len, steps, device, assumed_tflops):
    desc, step = build_step(meta["n_vocab"], seq_len, device)
    out = {"model": desc, "batch_size": batch_size, "seq_len": seq_len, "device": device}
    for prefetch in (True, False):
        loader = data.make_loader(meta, "train", "mlm", seed=0, device=device, prefetch=prefetch)
        step(loader.next_batch(batch_size, seq_len))  # warm-up
        t_load = t_step = 0.0
        for _ in range(steps):
            t0 = time.perf_counter()
            batch = loader.next_batch(batch_size, seq_len)
            t1 = time.perf_counter()
            step(batch)
            t2 = time.perf_counter()
            t_load, t_step = t_load + t1 - t0, t_step + t2 - t1
        name = "prefetch" if prefetch else "sync"
        out[f"loader_ms_{name}"] = 1e3 * t_load / steps
        out[f"step_ms_{name}"] = 1e3 * t_step / steps
        out[f"loader_fraction_{name}"] = t_load / t_step
    # the loader alone (no model competing for the cores), and the step time a GPU would need for the crammed
    # base model at an assumed throughput: the fraction the loader would cost if it were not overlapped
    out["alone"] = []
    for B in sorted({batch_size, 256}):
        loader = data.make_loader(meta, "train", "mlm", seed=0, prefetch=False)
        t_alone, _ = timed(lambda: [loader.next_batch(B, seq_len) for _ in range(20)], 3)
        row = {"batch_size": B, "loader_ms": 1e3 * t_alone / 20, "tokens_per_s": 20 * B * seq_len / t_alone}
        flops = model.flops_per_token(model.make_config("base", vocab_size=meta["n_vocab"]), seq_len)
        row["base_step_ms"] = 1e3 * flops * B * seq_len / (assumed_tflops * 1e12)
        row["fraction_base_gpu_sync"] = row["loader_ms"] / row["base_step_ms"]
        out["alone"].append(row)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab-size", type=int, default=8192, help="vocabulary size of both tokenizers (tokens)")
    p.add_argument("--repeat", type=int, default=3, help="timing repeats; the best is reported")
    p.add_argument("--batch-size", type=int, default=32, help="sequences per training step")
    p.add_argument("--max-seq-len", "--seq-len", dest="seq_len", type=int, default=128, help="tokens per sequence")
    p.add_argument("--steps", type=int, default=5, help="timed training steps per loader setting")
    p.add_argument("--assumed-tflops", type=float, default=400.0,
                   help="achieved GPU throughput (TFLOP/s) for the estimated crammed-base step time")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    p.add_argument("--out", default="runs/bench_data.json", help="JSON results file")
    args = p.parse_args()

    docs = list(data.iter_documents(data.SAMPLE_CORPUS))
    tok = bench_tokenizers(docs, args.vocab_size, args.repeat)
    with tempfile.TemporaryDirectory() as cache:
        meta = data.prepare_data("sample", cache, vocab_size=args.vocab_size, progress=False)
        loader = bench_loader(meta, args.batch_size, args.seq_len, args.steps, args.device, args.assumed_tflops)
    results = {**tok, **loader, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)

    r = results
    print("---")
    print(f"corpus:              sample, {r['corpus_mb']:.2f} MB, vocab {r['vocab_size']}")
    print(f"train tokenizer:     rustbpe {r['train_s_rustbpe']:.2f} s | HF tokenizers {r['train_s_hf']:.2f} s "
          f"| ratio HF/ours {r['train_speedup']:.2f}x")
    print(f"encode, batch:       tiktoken {r['encode_mbps_tiktoken_batch']:.1f} MB/s | HF "
          f"{r['encode_mbps_hf_batch']:.1f} MB/s | ratio {r['encode_speedup_batch']:.2f}x ({r['encode_threads']} threads)")
    print(f"encode, one thread:  tiktoken {r['encode_mbps_tiktoken_1thread']:.1f} MB/s | HF "
          f"{r['encode_mbps_hf_1thread']:.1f} MB/s | ratio {r['encode_speedup_1thread']:.2f}x")
    print(f"loader vs step:      {r['model']}, batch {r['batch_size']} x {r['seq_len']} on {r['device']}")
    for name in ("prefetch", "sync"):
        print(f"  {name + ':':18s} next_batch {r[f'loader_ms_{name}']:.2f} ms | step {r[f'step_ms_{name}']:.1f} ms "
              f"| fraction {100 * r[f'loader_fraction_{name}']:.2f}% (target < 2%)")
    for row in r["alone"]:
        line = (f"loader alone, B={row['batch_size']:<4d} {row['loader_ms']:.2f} ms per batch = "
                f"{row['tokens_per_s'] / 1e6:.1f} M tokens/s (one thread, no prefetch)")
        if "base_step_ms" in row:
            line += (f" | crammed-base step at {args.assumed_tflops:.0f} TFLOP/s (estimate) {row['base_step_ms']:.1f} ms"
                     f" -> {100 * row['fraction_base_gpu_sync']:.2f}% if not overlapped")
        print(line)
    print(f"json:                {args.out}")


if __name__ == "__main__":
    main()
