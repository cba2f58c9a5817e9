"""Training-step throughput of our model against a Hugging Face baseline of the same shape.

    python bench/bench_model.py                     # base shape, against ModernBertForMaskedLM
    python bench/bench_model.py --baseline bert     # against BertForMaskedLM instead
    python bench/bench_model.py --preset mini --steps 20

Both models get the same depth, width, heads, vocabulary and sequence length, the same batch of masked tokens
(25% masking) and AdamW; one step is forward + backward + optimizer step. Steps of the two models alternate one by
one in one process, so a busy machine slows both alike, and the script prints the ratio of median
tokens/s. On CUDA it also prints our model's MFU against the GPU's peak bf16 FLOP/s.
Baselines (--baseline): "modernbert" (default; hf_modernbert: pre-LN, GeGLU of our gated width,
rotary, all layers global, sparse prediction) or "bert" (hf_bert: the post-LN BERT of 2018).
Needs `pip install transformers` (a benchmark-only dependency).
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import model  # noqa: E402
from planning import gpu_peak_flops  # noqa: E402

def make_batch(cfg, batch_size, device, seed=0):
    """Random tokens with k = mask_rate * T masked positions per sequence, as data.py produces them."""
    g = torch.Generator().manual_seed(seed)
    T, V = cfg["max_seq_len"], cfg["vocab_size"]
    k = round(cfg["mask_rate"] * T)
    ids = torch.randint(5, V, (batch_size, T), generator=g)
    positions = torch.stack([torch.randperm(T, generator=g)[:k] for _ in range(batch_size)])
    labels = ids.gather(1, positions)
    dense_labels = torch.full_like(ids, -100).scatter(1, positions, labels)
    ids = ids.scatter(1, positions, 4)  # the [MASK] id
    return {k_: v.to(device) for k_, v in dict(ids=ids, positions=positions, labels=labels, dense=dense_labels).items()}


def ours(cfg, device):
    net = model.build_model(cfg).to(device).train()
    def step(b):
        return net(b["ids"], labels=b["labels"], label_positions=b["positions"])["loss"]
    return net, step


def hf_bert(cfg, dropout=0.0, intermediate=None):
    """Hugging Face BertForMaskedLM of our config's depth, width, heads, padded vocabulary and
    sequence length: post-LN, learned positions, a GELU feed-forward of width `intermediate`
    (default: BERT's 4 x d), a dense MLM head, SDPA attention."""
    from transformers import BertConfig, BertForMaskedLM
    hf_cfg = BertConfig(vocab_size=model.padded_vocab_size(cfg), hidden_size=cfg["d_model"],
                        num_hidden_layers=cfg["n_layers"], num_attention_heads=cfg["n_heads"],
                        intermediate_size=intermediate or 4 * cfg["d_model"],
                        max_position_embeddings=cfg["max_seq_len"],
                        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    hf_cfg._attn_implementation = "sdpa"
    return BertForMaskedLM(hf_cfg)


def modernbert_intermediate(cfg):
    """ModernBERT's intermediate_size for our config. Its Wi is d x 2I (GeGLU: value and gate
    halves) and its Wo I x d (transformers' ModernBertMLP): the same 3 d I weights as our gated
    FFN of ffn_dim = I. An ungated FFN of ours (2 d f weights) gets I = 2 f / 3: the same too."""
    f = cfg["ffn_dim"]
    return f if cfg["activation"] in model.GATED else max(1, round(2 * f / 3))


def hf_modernbert(cfg, intermediate=None):
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
    its identity attention norm in layer 0, its norm eps 1e-5 and its truncated-normal init."""
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
    hf_cfg._attn_implementation = "sdpa"  # PyTorch's SDPA also runs on CPU
    return ModernBertForMaskedLM(hf_cfg)


BASELINES = {"modernbert": "ModernBERT", "bert": "BERT"}  # --baseline value -> name in reports


def hf_baseline(name, cfg, intermediate=None):
    """The Hugging Face baseline `name` ("modernbert" or "bert") of our config, dropout 0
    (cramming pretrains without it). intermediate: its FFN width (default:
    modernbert_intermediate, or BERT's 4 x d)."""
    if name == "modernbert":
        return hf_modernbert(cfg, intermediate)
    if name == "bert":
        return hf_bert(cfg, dropout=0.0, intermediate=intermediate)
    raise ValueError(f"unknown baseline {name!r}; choose from {', '.join(BASELINES)}")


def huggingface(cfg, device, baseline="modernbert"):
    net = hf_baseline(baseline, cfg).to(device).train()  # dropout off, like ours: the same work
    # Dense labels, -100 but at the masked positions: ModernBERT's sparse head keeps just those.
    def step(b):
        return net(input_ids=b["ids"], labels=b["dense"]).loss
    return net, step


def make_stepper(net, step, device, dtype):
    """A function that runs one training step (forward, backward, AdamW) and returns its seconds."""
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4, fused=device.type == "cuda")
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


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="base", help="model preset of model.py (default: base, the crammed BERT)")
    p.add_argument("--batch-size", type=int, default=None, help="sequences per step (default: 8 on CPU, 256 on CUDA)")
    p.add_argument("--steps", type=int, default=20, help="timed steps of each model, alternating (default: 20)")
    p.add_argument("--compile", action="store_true", help="torch.compile our model (CUDA)")
    p.add_argument("--baseline", choices=list(BASELINES), default="modernbert",
                   help="the Hugging Face model: modernbert (default) or bert")
    p.add_argument("--skip-hf", action="store_true", help="time only our model (no transformers needed), e.g. for MFU")
    p.add_argument("--out", default=None, help="write the results as JSON to this file")
    args = p.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    cfg = model.make_config(args.preset)
    B = args.batch_size or (256 if device.type == "cuda" else 8)
    batch = make_batch(cfg, B, device)
    tokens = B * cfg["max_seq_len"]
    net_a, step_a = ours(cfg, device)
    if args.compile:
        compiled = torch.compile(net_a)
        step_a = lambda b: compiled(b["ids"], labels=b["labels"], label_positions=b["positions"])["loss"]  # noqa: E731
    run_a = make_stepper(net_a, step_a, device, dtype)
    net_b = run_b = None
    if not args.skip_hf:
        net_b, step_b = huggingface(cfg, device, args.baseline)
        run_b = make_stepper(net_b, step_b, device, dtype)
    for _ in range(2):  # warm-up: allocator, kernels, compilation
        run_a(batch), run_b and run_b(batch)
    t_ours, t_hf = [], []
    for _ in range(args.steps):  # alternate single steps, so load from other processes hits both alike
        t_ours.append(run_a(batch))
        if run_b:
            t_hf.append(run_b(batch))
    tps_ours = tokens / statistics.median(t_ours)
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(dtype).replace("torch.", ""), "preset": args.preset, "batch_size": B, "seq_len": cfg["max_seq_len"],
        "params_ours": model.count_params(cfg), "tokens_per_s_ours": round(tps_ours),
    }
    if run_b:
        tps_hf = tokens / statistics.median(t_hf)
        result.update(baseline=args.baseline, params_hf=sum(p.numel() for p in net_b.parameters()),
                      tokens_per_s_hf=round(tps_hf),
                      speedup=round(tps_ours / tps_hf, 3))
    peak = gpu_peak_flops(device)
    if peak:
        result["mfu_ours"] = round(tps_ours * model.flops_per_token(cfg) / peak, 3)
    print(f"{result['device']} {result['dtype']}, preset {args.preset}, batch {B} x {cfg['max_seq_len']} tokens")
    print(f"  ours            {tps_ours:10.0f} tokens/s  ({result['params_ours'] / 1e6:.1f} M params)"
          + (f"   MFU {result['mfu_ours']:.1%}" if peak else ""))
    if run_b:
        print(f"  HF {BASELINES[args.baseline]:<12} {result['tokens_per_s_hf']:10.0f} tokens/s  "
              f"({result['params_hf'] / 1e6:.1f} M params)")
        print(f"  ratio ours / HF {result['speedup']:.2f}x")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
