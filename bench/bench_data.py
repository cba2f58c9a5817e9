"""Benchmark data.py on the bundled sample, side by side with Hugging Face `tokenizers`, in one run.

    python bench/bench_data.py                       # vocab 8192, batch 32 x 128, CPU
    python bench/bench_data.py --vocab-size 32768 --device cuda
    python bench/bench_data.py --mixture             # only section 4: a two-language mixture

Reports, each with a ratio (absolute times depend on the machine and load; ratios travel better):
1. tokenizer training time: rustbpe (tokenizer.train_tokenizer) vs tokenizers' BPE trainer
   (byte-level, same split pattern, same vocabulary size);
2. encoding throughput in MB/s of UTF-8 text: tiktoken vs tokenizers, in a batch (all threads)
   and on one thread;
3. the loader's cost as a fraction of a training step (fwd + bwd + AdamW of model.py's "mini"
   preset, MLM): next_batch's time on the critical path, with prefetch (default) and without.
4. (--mixture, instead of 1-3) a two-language mixture: English (the sample) and a second
   language, by default French from the system's gettext catalogs
   (/usr/share/locale/fr/LC_MESSAGES/*.mo: translated program messages, cut to --second-chars
   characters, a tenth of the sample, so it is the small language), or --second PATH. One
   tokenizer per temperature (T = 1, by size, and T = --mix-temperature) and each language's
   fertility (tokens per whitespace word) and bytes per token; then next_batch of the mixture
   against one source's loader.
Results are printed and written as JSON (--out).
"""
import argparse
import glob
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import data  # noqa: E402
import model  # noqa: E402
import tokenizer  # noqa: E402
from loader import make_loader  # noqa: E402


def timed(fn, repeat=1):
    """Best wall time of `repeat` calls.

    The minimum is the least noisy estimate on a shared machine."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def hf_bpe(docs, vocab_size):
    """tokenizers' byte-level BPE like ours: same split regex, byte alphabet, 8 special tokens."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(tokenizer.SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    specials = tokenizer.SPECIAL_TOKENS + [f"[RESERVED_{i}]" for i in range(tokenizer.MIN_RESERVED)]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, min_frequency=0,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer)
    return tok


def bench_tokenizers(docs, vocab_size, repeat):
    mb = sum(len(d.encode("utf-8")) for d in docs) / 1e6
    t_ours, enc = timed(lambda: tokenizer.train_tokenizer(docs, vocab_size), repeat)
    t_hf, hf = timed(lambda: hf_bpe(docs, vocab_size), repeat)
    threads = os.cpu_count() or 1
    e_ours, ids = timed(lambda: enc.encode_ordinary_batch(docs, num_threads=threads), repeat)
    e_hf, _ = timed(lambda: hf.encode_batch(docs, add_special_tokens=False), repeat)
    s_ours, _ = timed(lambda: [enc.encode_ordinary(d) for d in docs], repeat)
    s_hf, _ = timed(lambda: [hf.encode(d, add_special_tokens=False) for d in docs], repeat)
    return {"corpus_mb": mb, "vocab_size": vocab_size, "n_vocab_ours": enc.n_vocab,
            "n_vocab_hf": hf.get_vocab_size(),
            "bytes_per_token_ours": mb * 1e6 / sum(map(len, ids)),
            "train_s_rustbpe": t_ours, "train_s_hf": t_hf, "train_speedup": t_hf / t_ours,
            "encode_mbps_tiktoken_batch": mb / e_ours, "encode_mbps_hf_batch": mb / e_hf,
            "encode_speedup_batch": e_hf / e_ours, "encode_threads": threads,
            "encode_mbps_tiktoken_1thread": mb / s_ours, "encode_mbps_hf_1thread": mb / s_hf,
            "encode_speedup_1thread": s_hf / s_ours}


def build_step(n_vocab, seq_len, device):
    """(description, step(batch)) for one training step: fwd + bwd + AdamW."""
    config = model.make_config("mini", vocab_size=n_vocab, max_seq_len=seq_len)
    net = model.build_model(config).to(device)
    desc = "model.py 'mini' (4 layers, d 256), sparse MLM"

    def forward(b):
        return net(b["input_ids"], labels=b["labels"], label_positions=b["label_positions"])["loss"]
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
        loader = make_loader(meta, "train", {"seed": 0}, device=device, prefetch=prefetch)
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
    # The loader alone (no model competing for the cores), and the step time a GPU would need for
    # the crammed base model at an assumed throughput: the fraction the loader would cost if it
    # were not overlapped.
    out["alone"] = []
    for B in sorted({batch_size, 256}):
        loader = make_loader(meta, "train", {"seed": 0}, prefetch=False)
        t_alone, _ = timed(lambda: [loader.next_batch(B, seq_len) for _ in range(20)], 3)
        row = {"batch_size": B, "loader_ms": 1e3 * t_alone / 20,
               "tokens_per_s": 20 * B * seq_len / t_alone}
        base = model.make_config("base", vocab_size=meta["n_vocab"])
        flops = model.flops_per_token(base, seq_len)
        row["base_step_ms"] = 1e3 * flops * B * seq_len / (assumed_tflops * 1e12)
        row["fraction_base_gpu_sync"] = row["loader_ms"] / row["base_step_ms"]
        out["alone"].append(row)
    return out


def french_messages(max_chars, folder="/usr/share/locale/fr/LC_MESSAGES"):
    """Documents of 50 French gettext messages each, max_chars characters in all."""
    import gettext
    seen, messages = set(), []
    for path in sorted(glob.glob(os.path.join(folder, "*.mo"))):
        try:
            with open(path, "rb") as f:
                catalog = gettext.GNUTranslations(f)._catalog
        except (OSError, UnicodeDecodeError):  # not a catalog, or one in another encoding
            continue
        for key, text in catalog.items():
            if key and isinstance(text, str) and text not in seen:
                seen.add(text)
                messages.append(text)
    if not messages:
        raise SystemExit(f"error: no gettext catalogs in {folder}; "
                         "give a second-language corpus with --second PATH")
    docs, n = [], 0
    for i in range(0, len(messages), 50):
        docs.append("\n".join(messages[i:i + 50]) + "\n")
        n += len(docs[-1])
        if n >= max_chars:
            break
    return docs


def paired_batch_times(mixed, single, B, T, pairs=300, distinct=10):
    """Seconds of next_batch for the mixture and for one source at the same stream position, in
    interleaved pairs (which one goes first alternates), over the stream's first `distinct` batches
    again and again. A load change on a shared machine then hits both sides of a pair alike, and
    the median of the pair ratios is stable where a ratio of two separate bests is not."""
    stride = T - 2 if mixed.objective == "mlm" else T
    times = {"mixture": [], "single": []}
    for i in range(pairs):
        order = ((("mixture", mixed), ("single", single)) if i % 2 == 0
                 else (("single", single), ("mixture", mixed)))
        for name, loader in order:
            loader.position = (i % distinct) * B * stride
            t0 = time.perf_counter()
            loader.next_batch(B, T)
            times[name].append(time.perf_counter() - t0)
    return times


def bench_mixture(args, cache):
    """Section 4, the two-language mixture.

    Fertility per language at two temperatures, and the mixture loader's cost per batch."""
    if args.second:
        second, label = args.second, args.second
    else:
        second = os.path.join(cache, "fr.jsonl")
        with open(second, "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": d}) + "\n" for d in french_messages(args.second_chars))
        label = "French gettext catalogs"
    out = {"second": label, "vocab_size": args.vocab_size, "temperatures": []}
    for T in (1.0, args.mix_temperature):
        settings = {"vocab_size": args.vocab_size, "mix_temperature": T}
        meta = data.prepare_data(f"sample,{second}", cache, settings, progress=False)
        fields = ("name", "weight", "chars", "train_tokens", "bytes_per_token", "tokens_per_word")
        out["temperatures"].append({"T": T, "sources": [
            {k: s[k] for k in fields} for s in meta["sources"]]})
    # The loader: the last mixture against its English source alone, i.e. today's Loader over
    # the same shards.
    english = meta["sources"][0]["name"]
    out["loader"] = []
    for B in sorted({args.batch_size, 256}):
        mixed = make_loader(meta, "train", {"seed": 0}, prefetch=False)
        single = make_loader(meta, "train", {"seed": 0}, prefetch=False, source=english)
        times = paired_batch_times(mixed, single, B, args.seq_len, pairs=args.repeat * 100)
        ratios = [m / s for m, s in zip(times["mixture"], times["single"])]
        quartiles = statistics.quantiles(ratios, n=4)
        out["loader"].append({"batch_size": B,
                              "mixture_ms": 1e3 * statistics.median(times["mixture"]),
                              "single_ms": 1e3 * statistics.median(times["single"]),
                              "ratio": statistics.median(ratios),
                              "ratio_quartiles": [quartiles[0], quartiles[2]],
                              "epochs": mixed.epochs()})
    return out


def print_mixture(r, seq_len):
    print("---")
    print(f"mixture:             sample (English) + {r['second']}, one tokenizer per temperature, "
          f"vocab {r['vocab_size']}")
    for t in r["temperatures"]:
        cells = " | ".join(f"{s['name']} weight {s['weight']:.3f}, "
                           f"{s['tokens_per_word']:.3f} tokens/word, "
                           f"{s['bytes_per_token']:.3f} bytes/token" for s in t["sources"])
        print(f"  T = {t['T']:<5.3g}           {cells}")
    for row in r["loader"]:
        low, high = row["ratio_quartiles"]
        print(f"loader, B={row['batch_size']:<4d} x {seq_len}: "
              f"mixture {row['mixture_ms']:.3f} ms | "
              f"one source {row['single_ms']:.3f} ms per batch (medians) | "
              f"ratio {row['ratio']:.3f}, middle half {low:.3f}-{high:.3f} (target < 1.10)")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab-size", type=int, default=8192,
                   help="vocabulary size of both tokenizers (tokens)")
    p.add_argument("--repeat", type=int, default=3,
                   help="timing repeats; the best is reported "
                        "(--mixture: 100 interleaved pairs each, the median reported)")
    p.add_argument("--batch-size", type=int, default=32, help="sequences per training step")
    p.add_argument("--max-seq-len", "--max-seq-len", dest="seq_len", type=int, default=128,
                   help="tokens per sequence")
    p.add_argument("--steps", type=int, default=5, help="timed training steps per loader setting")
    p.add_argument("--assumed-tflops", type=float, default=400.0,
                   help="achieved GPU throughput (TFLOP/s) for the estimated crammed-base "
                        "step time")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cpu or cuda")
    p.add_argument("--out", default=None,
                   help="JSON results file (default runs/bench_data.json, "
                        "with --mixture runs/bench_data_mixture.json)")
    p.add_argument("--mixture", action="store_true",
                   help="run section 4 (a two-language mixture) instead of 1-3")
    p.add_argument("--second", default=None,
                   help="second-language corpus for --mixture "
                        "(default: French gettext catalogs of this system)")
    p.add_argument("--second-chars", type=int, default=500_000,
                   help="characters of the default French corpus "
                        "(a tenth of the sample: the small language)")
    p.add_argument("--mix-temperature", type=float, default=1 / 0.3,
                   help="the flatter temperature compared with T = 1 "
                        "(default 1/0.3: XLM-R's alpha = 0.3)")
    args = p.parse_args()
    args.out = args.out or f"runs/bench_data{'_mixture' if args.mixture else ''}.json"
    if args.mixture:
        with tempfile.TemporaryDirectory() as cache:
            results = bench_mixture(args, cache)
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"mixture": results}, f, indent=1)
        print_mixture(results, args.seq_len)
        print(f"json:                {args.out}")
        return

    docs = list(data.iter_documents(data.SAMPLE_CORPUS))
    tok = bench_tokenizers(docs, args.vocab_size, args.repeat)
    with tempfile.TemporaryDirectory() as cache:
        meta = data.prepare_data("sample", cache, {"vocab_size": args.vocab_size}, progress=False)
        loader = bench_loader(meta, args.batch_size, args.seq_len, args.steps, args.device,
                              args.assumed_tflops)
    results = {**tok, **loader,
               "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)

    r = results
    print("---")
    print(f"corpus:              sample, {r['corpus_mb']:.2f} MB, vocab {r['vocab_size']}")
    print(f"train tokenizer:     rustbpe {r['train_s_rustbpe']:.2f} s | "
          f"HF tokenizers {r['train_s_hf']:.2f} s | ratio HF/ours {r['train_speedup']:.2f}x")
    print(f"encode, batch:       tiktoken {r['encode_mbps_tiktoken_batch']:.1f} MB/s | HF "
          f"{r['encode_mbps_hf_batch']:.1f} MB/s | ratio {r['encode_speedup_batch']:.2f}x "
          f"({r['encode_threads']} threads)")
    print(f"encode, one thread:  tiktoken {r['encode_mbps_tiktoken_1thread']:.1f} MB/s | HF "
          f"{r['encode_mbps_hf_1thread']:.1f} MB/s | ratio {r['encode_speedup_1thread']:.2f}x")
    print(f"loader vs step:      {r['model']}, "
          f"batch {r['batch_size']} x {r['seq_len']} on {r['device']}")
    for name in ("prefetch", "sync"):
        print(f"  {name + ':':18s} next_batch {r[f'loader_ms_{name}']:.2f} ms "
              f"| step {r[f'step_ms_{name}']:.1f} ms "
              f"| fraction {100 * r[f'loader_fraction_{name}']:.2f}% (target < 2%)")
    for row in r["alone"]:
        line = (f"loader alone, B={row['batch_size']:<4d} {row['loader_ms']:.2f} ms per batch = "
                f"{row['tokens_per_s'] / 1e6:.1f} M tokens/s (one thread, no prefetch)")
        if "base_step_ms" in row:
            line += (f" | crammed-base step at {args.assumed_tflops:.0f} TFLOP/s (estimate) "
                     f"{row['base_step_ms']:.1f} ms"
                     f" -> {100 * row['fraction_base_gpu_sync']:.2f}% if not overlapped")
        print(line)
    print(f"json:                {args.out}")


if __name__ == "__main__":
    main()
