"""Training-step throughput of our model against a Hugging Face baseline of the same shape, and
what each speed lever buys our step.

    python bench/bench_model.py                     # base shape, against ModernBertForMaskedLM
    python bench/bench_model.py --baseline bert     # against BertForMaskedLM instead
    python bench/bench_model.py --preset mini --batch-size 32 --dtype fp32
    python bench/bench_model.py --preset mini --batch-size 32 --levers   # each lever alone

Both models get the same depth, width, heads, vocabulary and sequence length, the same batch of
masked tokens (25% masking), the same autocast dtype (--dtype), the same compile choice (--compile:
ours block by block as train.py compiles it, the baseline whole, as `torch.compile(model)` does)
and AdamW; one step is forward + backward + optimizer step. Steps of the two models alternate one
by one in one process, so a busy machine slows both alike, and the script prints the ratio of
median tokens/s. It also times square torch.mm calls (2048 x 2048, or smaller where bf16 is
emulated and slow) in fp32 and in bf16 in the same run, and prints each model's training
FLOP/s (model.flops_per_token, matmuls only) as a share of them: how close the step gets to this
machine's matmul speed. On CUDA it also prints our MFU against the GPU's peak bf16 FLOP/s.
Baselines (--baseline): "modernbert" (default; hf_modernbert: pre-LN, GeGLU of our gated width,
rotary, all layers global, sparse prediction) or "bert" (hf_bert: the post-LN BERT of 2018).
--levers times our step alone under each speed lever (fused AdamW, bf16 autocast with and without
matmul attention, torch.compile) against our fp32 eager step, all alternating.
On a CPU malloc keeps the memory each step frees, as train.py has it (parallel.keep_freed_memory);
--glibc-defaults leaves glibc's malloc as it is, for both models: compare two runs to see the gain.
Needs `pip install transformers` (a benchmark-only dependency) unless --skip-hf or --levers.
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import files  # noqa: E402
import model  # noqa: E402
import parallel  # noqa: E402
from planning import gpu_peak_flops  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def make_batch(cfg, batch_size, device, seed=0):
    """Random tokens with k = mask_rate * T masked positions per sequence, as data.py produces
    them."""
    g = torch.Generator().manual_seed(seed)
    T, V = cfg["max_seq_len"], cfg["vocab_size"]
    k = round(cfg["mask_rate"] * T)
    ids = torch.randint(5, V, (batch_size, T), generator=g)
    positions = torch.stack([torch.randperm(T, generator=g)[:k] for _ in range(batch_size)])
    labels = ids.gather(1, positions)
    dense_labels = torch.full_like(ids, -100).scatter(1, positions, labels)
    ids = ids.scatter(1, positions, 4)  # the [MASK] id
    batch = dict(ids=ids, positions=positions, labels=labels, dense=dense_labels)
    return {k_: v.to(device) for k_, v in batch.items()}


def ours(cfg, device, compile=False):
    """Our model and its step: the loss of one batch. compile: each block through torch.compile,
    as train.py --compile runs it (parallel.compile_blocks)."""
    net = model.build_model(cfg).to(device).train()
    if compile:
        parallel.compile_blocks(net)
    def step(b):
        return net(b["ids"], labels=b["labels"], label_positions=b["positions"])["loss"]
    return net, step


def hf_bert(cfg, dropout=0.0, intermediate=None, attention="sdpa"):
    """Hugging Face BertForMaskedLM of our config's depth, width, heads, padded vocabulary and
    sequence length: post-LN, learned positions, a GELU feed-forward of width `intermediate`
    (default: BERT's 4 x d), a dense MLM head, SDPA attention."""
    from transformers import BertConfig, BertForMaskedLM
    hf_cfg = BertConfig(vocab_size=model.padded_vocab_size(cfg), hidden_size=cfg["d_model"],
                        num_hidden_layers=cfg["n_layers"], num_attention_heads=cfg["n_heads"],
                        intermediate_size=intermediate or 4 * cfg["d_model"],
                        max_position_embeddings=cfg["max_seq_len"],
                        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    hf_cfg._attn_implementation = attention
    return BertForMaskedLM(hf_cfg)


def modernbert_intermediate(cfg):
    """ModernBERT's intermediate_size for our config. Its Wi is d x 2I (GeGLU: value and gate
    halves) and its Wo I x d (transformers' ModernBertMLP): the same 3 d I weights as our gated
    FFN of ffn_dim = I. An ungated FFN of ours (2 d f weights) gets I = 2 f / 3: the same too."""
    f = cfg["ffn_dim"]
    return f if cfg["activation"] in model.GATED else max(1, round(2 * f / 3))


def hf_modernbert(cfg, intermediate=None, attention="sdpa"):
    """Hugging Face ModernBertForMaskedLM (Warner et al. 2024) of our config's depth, width, heads,
    padded vocabulary, sequence length and gated FFN width (modernbert_intermediate): pre-LN,
    GeGLU, rotary at its default global theta (160,000), no biases, tied embeddings, SDPA.
    Departures from the published ModernBERT-base config, to compare like with like:
      - every layer global: ModernBERT alternates 1 global and 2 local layers (a 128-token
        window, 64 each side), a saving for its 8,192-token context; at our 128 tokens a local
        layer would only hide context;
      - sparse_prediction=True: only positions whose label is not -100 reach the head, as ours;
      - dropout 0 everywhere (cramming pretrains without; ModernBERT's defaults are 0 too);
      - decoder_bias=False: no biases anywhere, like ours (the published head has one);
      - no pad/cls/sep ids: our packed sequences hold no padding, our embedding no padding row.
    It keeps ModernBERT's MLM head transform (dense d x d, GELU, norm), its norms without biases,
    its identity attention norm in layer 0, its norm eps 1e-5 and its truncated-normal init.
    attention: transformers' attention implementation, "sdpa" or "eager" (hf_attention)."""
    from transformers import ModernBertConfig, ModernBertForMaskedLM
    n = cfg["n_layers"]
    hf_cfg = ModernBertConfig(
        vocab_size=model.padded_vocab_size(cfg), hidden_size=cfg["d_model"],
        num_hidden_layers=n, num_attention_heads=cfg["n_heads"],
        intermediate_size=intermediate or modernbert_intermediate(cfg),
        max_position_embeddings=cfg["max_seq_len"], hidden_activation="gelu",
        # transformers >= 5 spells global_attn_every_n_layers=1 as layer_types
        layer_types=["full_attention"] * n,
        attention_dropout=0.0, embedding_dropout=0.0, mlp_dropout=0.0, classifier_dropout=0.0,
        attention_bias=False, mlp_bias=False, norm_bias=False, decoder_bias=False,
        classifier_bias=False, sparse_prediction=True, sparse_pred_ignore_index=-100,
        tie_word_embeddings=True, pad_token_id=None, bos_token_id=None, eos_token_id=None,
        cls_token_id=None, sep_token_id=None)
    hf_cfg._attn_implementation = attention  # PyTorch's SDPA also runs on CPU
    return ModernBertForMaskedLM(hf_cfg)


BASELINES = {"modernbert": "ModernBERT", "bert": "BERT"}  # --baseline value -> name in reports


def hf_attention(device, dtype):
    """The faster of transformers' attention implementations where the step runs: "eager"
    (matmuls and a softmax, as model.matmul_attention) in bf16 on a CPU, where PyTorch's fused
    SDPA kernel is slow (ModernBERT at 4 x 128, batch 32 x 128: 21,313 against 13,942 tokens/s;
    at mini 6,558 against 5,750), "sdpa" everywhere else. Our model makes the same choice."""
    return "eager" if device.type == "cpu" and dtype == torch.bfloat16 else "sdpa"


def hf_baseline(name, cfg, intermediate=None, attention="sdpa"):
    """The Hugging Face baseline `name` ("modernbert" or "bert") of our config, dropout 0
    (cramming pretrains without it). intermediate: its FFN width (default:
    modernbert_intermediate, or BERT's 4 x d). attention: "sdpa" or "eager"."""
    if name == "modernbert":
        return hf_modernbert(cfg, intermediate, attention)
    if name == "bert":
        return hf_bert(cfg, dropout=0.0, intermediate=intermediate, attention=attention)
    raise ValueError(f"unknown baseline {name!r}; choose from {', '.join(BASELINES)}")


def huggingface(cfg, device, baseline="modernbert", attention="sdpa", compile=False,
                intermediate=None):
    """The baseline and its step. Dropout is off, like ours: the same work. intermediate: its
    FFN width (hf_baseline's default if None)."""
    net = hf_baseline(baseline, cfg, intermediate, attention).to(device).train()
    run = torch.compile(net) if compile else net
    # Dense labels, -100 but at the masked positions: ModernBERT's sparse head keeps just those.
    def step(b):
        return run(input_ids=b["ids"], labels=b["dense"]).loss
    return net, step


def make_stepper(net, step, device, dtype, fused=None):
    """A function that runs one training step (forward, backward, AdamW) and returns its seconds.
    fused: AdamW's fused kernel (default: on CUDA only, as train.py)."""
    fused = device.type == "cuda" if fused is None else fused
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4, fused=fused)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def one_step(batch):
        sync()
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss = step(batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        return time.perf_counter() - t0
    return one_step


def matmul_flops(device, dtype, largest=2048, repeats=10, slow=0.05):
    """This machine's matmul speed in FLOP/s: the median of `repeats` n x n torch.mm calls.

    n doubles from 256 up to `largest`, stopping early once one call takes `slow` seconds: a GPU
    or a CPU with bf16 instructions is timed at 2048, while a CPU that emulates bf16 (about 50x
    slower than its fp32) is timed at the size where one call already takes that long, so that the
    probe costs about a second instead of minutes."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def seconds_per_call(n, calls):
        a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
        times = []
        for _ in range(calls):
            sync()
            t0 = time.perf_counter()
            a @ b
            sync()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    n = 256
    while n < largest and seconds_per_call(n, calls=2) < slow:
        n *= 2
    seconds_per_call(n, calls=3)  # warm-up calls at the chosen size
    return 2 * n ** 3 / seconds_per_call(n, calls=repeats)


def time_alternating(steppers, batch, steps, warmup=2):
    """{name: median seconds per step}: every stepper's steps interleaved one by one, so load from
    other processes hits all alike. warmup: untimed steps first (allocator, kernels, compile)."""
    for _ in range(warmup):
        for run in steppers.values():
            run(batch)
    times = {name: [] for name in steppers}
    for _ in range(steps):
        for name, run in steppers.items():
            times[name].append(run(batch))
    return {name: statistics.median(t) for name, t in times.items()}


@contextlib.contextmanager
def fused_attention_on_cpu():
    """Within it, model.py's blocks call F.scaled_dot_product_attention also in bf16 on a CPU,
    where they otherwise call model.matmul_attention: the attention lever, measured."""
    def sdpa(q, k, v, mask, is_causal, dropout):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                              dropout_p=dropout)
    plain, model.matmul_attention = model.matmul_attention, sdpa
    try:
        yield
    finally:
        model.matmul_attention = plain


def lever_steppers(cfg, device):
    """Our step under each speed lever alone, and two together, against the fp32 eager step
    ("reference"). Each gets its own model, so compiled and eager ones do not share a module."""
    bf16 = torch.bfloat16

    def variant(dtype, fused=None, compile=False, sdpa=False):
        net, step = ours(cfg, device, compile)
        if sdpa:  # the forward pass with SDPA; the backward follows the graph it recorded
            plain_step = step
            def step(b):
                with fused_attention_on_cpu():
                    return plain_step(b)
        return make_stepper(net, step, device, dtype, fused)
    return {
        "fp32 eager (reference)": variant(torch.float32),
        "fused AdamW": variant(torch.float32, fused=True),
        "bf16 autocast, SDPA attention": variant(bf16, sdpa=True),
        "bf16 autocast (matmul attention on CPU)": variant(bf16),
        "torch.compile, fp32": variant(torch.float32, compile=True),
        "torch.compile, bf16": variant(bf16, compile=True),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="base",
                   help="model preset of model.py (default: base, the crammed BERT)")
    p.add_argument("--config", default="", help="config keys over the preset, e.g. bench_cram's "
                   "shape: n_layers=4,d_model=128,n_heads=4,ffn_dim=352,vocab_size=4096,"
                   "positions=rotary")
    p.add_argument("--batch-size", type=int, default=None,
                   help="sequences per step (default: 8 on CPU, 256 on CUDA)")
    p.add_argument("--steps", type=int, default=20,
                   help="timed steps of each model, alternating (default: 20)")
    p.add_argument("--dtype", choices=["auto", *DTYPES], default="auto",
                   help="autocast dtype of both models: auto = train.py's choice (bf16 on a GPU "
                   "or a CPU with bf16 matmul instructions, else fp32)")
    p.add_argument("--compile", action="store_true", help="torch.compile both models")
    p.add_argument("--baseline", choices=list(BASELINES), default="modernbert",
                   help="the Hugging Face model: modernbert (default) or bert")
    p.add_argument("--skip-hf", action="store_true",
                   help="time only our model (no transformers needed), e.g. for MFU")
    p.add_argument("--levers", action="store_true",
                   help="time only our model, under each speed lever against fp32 eager")
    p.add_argument("--glibc-defaults", action="store_true",
                   help="on a CPU, leave malloc as glibc sets it, instead of keeping the memory "
                   "steps free as train.py does (parallel.keep_freed_memory), for both models")
    p.add_argument("--out", default=None, help="write the results as JSON to this file")
    args = p.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # Process-wide, so both models get it. A lever that cannot alternate step by step: its gain is
    # the reuse of the previous step's memory, so compare whole runs with and without the flag.
    keeps = device.type == "cpu" and not args.glibc_defaults and parallel.keep_freed_memory()
    dtype = DTYPES.get(args.dtype) or parallel.autocast_dtype("auto", device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    cfg = model.make_config(args.preset, **parse_config(args.config))
    B = args.batch_size or (256 if device.type == "cuda" else 8)
    batch = make_batch(cfg, B, device)
    tokens, flops = B * cfg["max_seq_len"], model.flops_per_token(cfg)
    mm = {"fp32": matmul_flops(device, torch.float32), "bf16": matmul_flops(device, torch.bfloat16)}
    name = str(dtype).replace("torch.", "")
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": name, "compile": args.compile, "preset": args.preset,
        "config": parse_config(args.config), "batch_size": B,
        "seq_len": cfg["max_seq_len"], "threads": torch.get_num_threads(),
        "matmul_gflops": {k: round(v / 1e9, 1) for k, v in mm.items()},
        "params_ours": model.count_params(cfg), "keeps_freed_memory": keeps,
    }
    print(f"{result['device']}, preset {args.preset}, batch {B} x {cfg['max_seq_len']} tokens, "
          f"{result['threads']} threads; torch.mm: {mm['fp32'] / 1e9:.0f} GFLOP/s "
          f"fp32, {mm['bf16'] / 1e9:.0f} bf16; malloc "
          f"{'keeps freed memory' if keeps else 'as glibc sets it'}")
    if args.levers:
        return report_levers(cfg, device, batch, args, result, tokens * flops)
    steppers = {"ours": make_stepper(*ours(cfg, device, args.compile), device, dtype)}
    if not args.skip_hf:
        attention = hf_attention(device, dtype)
        net_b, step_b = huggingface(cfg, device, args.baseline, attention, args.compile)
        steppers["hf"] = make_stepper(net_b, step_b, device, dtype)
        result.update(baseline=args.baseline, hf_attention=attention,
                      params_hf=sum(p.numel() for p in net_b.parameters()))
    print(f"  {name}{', compiled' if args.compile else ''}")
    seconds = time_alternating(steppers, batch, args.steps)
    for who, s in seconds.items():
        tps = tokens / s
        result[f"tokens_per_s_{who}"] = round(tps)
        # FLOP/s of our model's count at the same tokens/s: the same work for both models
        result[f"share_of_fp32_mm_{who}"] = round(tps * flops / mm["fp32"], 3)
        result[f"share_of_mm_{who}"] = round(tps * flops / mm["bf16" if name == "bfloat16"
                                                                else "fp32"], 3)
        label = "ours" if who == "ours" else f"HF {BASELINES[args.baseline]}"
        print(f"  {label:<15} {tps:10.0f} tokens/s  ({result['params_' + who] / 1e6:.1f} M "
              f"params)  {tps * flops / 1e9:6.0f} GFLOP/s = {result['share_of_fp32_mm_' + who]:.0%}"
              f" of fp32 torch.mm, {result['share_of_mm_' + who]:.0%} of {name}'s")
    if "hf" in seconds:
        result["speedup"] = round(seconds["hf"] / seconds["ours"], 3)
        print(f"  ratio ours / HF {result['speedup']:.2f}x")
    peak = gpu_peak_flops(device)
    if peak:
        result["mfu_ours"] = round(result["tokens_per_s_ours"] * flops / peak, 3)
        print(f"  MFU ours {result['mfu_ours']:.1%} of the GPU's peak bf16 FLOP/s")
    write(args.out, result)


def report_levers(cfg, device, batch, args, result, flops_per_step):
    """--levers: each lever's tokens/s, its ratio to the fp32 eager step, and its FLOP/s as a
    share of the fp32 torch.mm."""
    seconds = time_alternating(lever_steppers(cfg, device), batch, args.steps)
    ref = seconds["fp32 eager (reference)"]
    tokens = batch["ids"].numel()
    result["levers"] = {}
    for lever, s in seconds.items():
        share = flops_per_step / s / (result["matmul_gflops"]["fp32"] * 1e9)
        result["levers"][lever] = {"tokens_per_s": round(tokens / s), "ratio": round(ref / s, 3),
                                   "share_of_fp32_mm": round(share, 3)}
        print(f"  {lever:<42} {tokens / s:10.0f} tokens/s  {ref / s:5.2f}x  "
              f"{share:5.0%} of fp32 torch.mm")
    write(args.out, result)


def parse_config(text):
    """ "n_layers=4,positions=rotary" -> {"n_layers": 4, "positions": "rotary"}: integers where
    they parse as one, true/false as booleans, other values as strings."""
    overrides = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"error: --config item {item!r} is not KEY=VALUE")
        flags = {"true": True, "false": False}
        overrides[key.strip()] = (int(value) if value.strip().lstrip("-").isdigit()
                                  else flags.get(value.strip(), value.strip()))
    return overrides


def write(path, result):
    """--out's JSON, written whole (a temporary file, then a rename), its folder made if missing:
    a long benchmark never ends in a missing-folder error."""
    if path:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        files.atomic_write(path, lambda f: f.write(json.dumps(result, indent=2).encode()))


if __name__ == "__main__":
    main()
