"""export.py: exported folders load in transformers (no network) and compute what ours compute."""
import json
import os
import sys

import pytest
import torch

pytest.importorskip("transformers", reason="export tests need transformers (optional for growcram)")
pytest.importorskip("safetensors", reason="export tests need safetensors (optional for growcram)")
os.environ["HF_HUB_OFFLINE"] = "1"  # everything loads from local folders

import transformers  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
)

import export  # noqa: E402
import grow  # noqa: E402
import model  # noqa: E402
import tokenizer  # noqa: E402
from conftest import save_checkpoint, seeded_model, tiny  # noqa: E402

HAS_HF_TOKENIZER = hasattr(tokenizer, "save_hf_tokenizer")
# objective=clm, learned positions, gelu, pre-LN, no embedding norm: GPT-2's function exactly
GPT2_SHAPE = dict(objective="clm", positions="learned", activation="gelu", embedding_norm=False)


def batch(vocab, seed=0):
    """Two rows of 12 tokens, the second padded after 7 (attention_mask 0)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (2, 12), generator=g)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 7:] = 0
    return ids, mask


def our_logits(net, ids, mask):
    with torch.no_grad():
        return net.logits(net.encode(ids, mask))[..., :net.config["vocab_size"]]


def exported(tmp_path, net, name="ck", enc=None, **files):
    """Save net as a checkpoint (with enc's tokenizer.json when given), export it, return OUT."""
    ck = tmp_path / name
    if enc is None:
        model.save_model(net, str(ck))
    else:
        save_checkpoint(net, enc, ck)
    for file, doc in files.items():
        (ck / file).write_text(json.dumps(doc))
    out = str(tmp_path / f"{name}_hf")
    export.export(str(ck), out)
    return out


def assert_same_lm(net, out, auto):
    """The exported model's logits on a padded batch equal ours on every real position."""
    hf = auto.from_pretrained(out, trust_remote_code=True).eval()
    ids, mask = batch(net.config["vocab_size"])
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask).logits
    ours = our_logits(net, ids, mask)
    assert theirs.shape == ours.shape
    assert torch.allclose(theirs[mask.bool()], ours[mask.bool()], atol=1e-4)
    return hf


@pytest.mark.parametrize("overrides", [
    {},                                                               # crammed BERT: sinusoidal
    {"positions": "alibi", "norm": "rmsnorm", "activation": "swiglu"},
    {"norm_position": "post", "positions": "learned", "bias": True, "activation": "gelu",
     "tie_embeddings": False},                                        # BERT-shaped
    {"positions": "rotary", "embedding_norm": False},
    {"positions": "rotary", "qk_norm": True, "activation": "relu2", "tie_embeddings": False},
], ids=["cramming", "alibi-rms-swiglu", "bert-shaped", "rotary", "speedrun-options"])
def test_masked_lm_logits_and_loss_equal_ours(tmp_path, overrides):
    net = seeded_model(tiny(vocab_size=90, **overrides))  # 90 real tokens of 128 embedded rows
    out = exported(tmp_path, net)
    hf = assert_same_lm(net, out, AutoModelForMaskedLM)
    assert type(hf).__name__ == "GrowcramForMaskedLM"
    ids, mask = batch(90)
    labels = torch.full_like(ids, -100)
    labels[:, 3] = ids[:, 3]
    with torch.no_grad():
        loss = hf(input_ids=ids, attention_mask=mask, labels=labels).loss
    # over the 90 real tokens: the exported logits leave out the embedding's padding rows
    expected = torch.nn.functional.cross_entropy(our_logits(net, ids, mask)[:, 3], ids[:, 3])
    assert torch.allclose(loss, expected, atol=1e-5)


@pytest.mark.parametrize("overrides,stock", [
    ({"positions": "rotary"}, False), (GPT2_SHAPE, True), ({**GPT2_SHAPE, "bias": True,
                                                            "tie_embeddings": False}, True)],
    ids=["rotary", "gpt2-shaped", "gpt2-shaped-bias-untied"])
def test_causal_lm_logits_equal_ours_and_stock_gpt2_where_it_maps(tmp_path, overrides, stock):
    net = seeded_model(tiny(vocab_size=90, **{"objective": "clm", **overrides}))
    out = exported(tmp_path, net)
    hf = assert_same_lm(net, out, AutoModelForCausalLM)
    assert (type(hf).__name__ == "GPT2LMHeadModel") == stock
    assert os.path.exists(os.path.join(out, "modeling_growcram.py")) != stock


def test_classifier_logits_equal_ours_and_labels_are_named(tmp_path):
    net = model.add_classifier(seeded_model(tiny()), 3)
    out = exported(tmp_path, net.eval(), **{"labels.json": ["contradiction", "entailment",
                                                            "neutral"]})
    hf = AutoModelForSequenceClassification.from_pretrained(out, trust_remote_code=True).eval()
    assert hf.config.id2label == {0: "contradiction", 1: "entailment", 2: "neutral"}
    assert hf.config.label2id["neutral"] == 2
    ids, mask = batch(100)
    with torch.no_grad():
        assert torch.allclose(hf(input_ids=ids, attention_mask=mask).logits,
                              net.classify(ids, mask)["logits"], atol=1e-4)


def test_grown_model_exports(tmp_path):
    small = seeded_model(tiny())
    grown, _ = grow.grow_model(small, tiny(n_layers=4, ffn_dim=96), method="stack", noise=0.01)
    out = exported(tmp_path, grown)
    # the checkpoint holds the plain block weights (grow.add_gate's c = 1 model): compare with it
    assert_same_lm(model.load_model(str(tmp_path / "ck")).eval(), out, AutoModelForMaskedLM)


@pytest.mark.parametrize("wrap", ["compile", "ddp", "ddp+compile"])
def test_compile_and_ddp_prefixes_are_stripped(tmp_path, wrap):
    class DDPLike(torch.nn.Module):  # DistributedDataParallel keeps the model in .module
        def __init__(self, module):
            super().__init__()
            self.module = module
    net = seeded_model(tiny())
    wrapped = {"compile": lambda: torch.compile(net), "ddp": lambda: DDPLike(net),
               "ddp+compile": lambda: torch.compile(DDPLike(net))}[wrap]()
    state = wrapped.state_dict()   # compiling happens at the first call, never here
    assert all(k.startswith(("_orig_mod.", "module.")) for k in state)
    ck = tmp_path / "ck"
    model.save_model(net, str(ck))
    torch.save(state, ck / "model.pt")
    export.export(str(ck), str(tmp_path / "hf"))
    from safetensors.torch import load_file
    assert set(load_file(str(tmp_path / "hf" / "model.safetensors"))) == set(net.state_dict())
    assert_same_lm(net, str(tmp_path / "hf"), AutoModelForMaskedLM)


@pytest.mark.parametrize("overrides", [{"positions": "rotary"}, GPT2_SHAPE], ids=["remote", "gpt2"])
def test_greedy_generate_equals_model_generate(tmp_path, enc, overrides):
    torch.manual_seed(0)
    net = seeded_model(tiny(vocab_size=enc.n_vocab, **{"objective": "clm", **overrides}))
    out = exported(tmp_path, net, enc=enc)
    hf = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    sep = enc.encode_single_token("[SEP]")
    prompt = [sep] + enc.encode_ordinary("the cat")
    # generation_config.json carries model.generate's rules: stop at [SEP], no other specials
    new = hf.generate(torch.tensor([prompt]), max_new_tokens=15)[0, len(prompt):].tolist()
    new = new[:new.index(sep)] if sep in new else new
    assert enc.decode(new) == model.generate(net, enc, "the cat", max_new_tokens=15)


def test_load_exported_round_trips(tmp_path):
    for cfg in (tiny(), tiny(vocab_size=90, **GPT2_SHAPE)):
        net = seeded_model(cfg)
        out = exported(tmp_path, net, name=cfg["objective"])
        back = export.load_exported(out)
        assert isinstance(back, model.Transformer) and back.config == net.config
        ids, mask = batch(90)
        assert torch.equal(our_logits(back, ids, mask), our_logits(net, ids, mask))
    with pytest.raises(ValueError, match="not written by export.py"):
        export.load_exported(str(tmp_path))


def test_remote_code_is_model_py_without_its_command_line(tmp_path):
    out = exported(tmp_path, seeded_model(tiny()))
    from transformers.dynamic_module_utils import get_imports
    # check_imports would refuse main's lazy `import tokenizer` wherever growcram is not installed
    assert get_imports(os.path.join(out, "growcram_model.py")) == ["json", "math", "os", "torch"]
    with open(os.path.join(out, "growcram_model.py")) as f:
        copy = f.read()
    with open(model.__file__) as f:
        source = f.read()
    assert "def main(" not in copy and source[:source.index("\ndef main(")].strip() in copy


def test_folder_contents_and_model_card(tmp_path, enc):
    net = seeded_model(tiny(vocab_size=enc.n_vocab))
    ck = save_checkpoint(net, enc, tmp_path / "run" / "final")
    summary = {"steps": 123, "final_val_loss": 4.5}       # train.py writes it beside final/
    (tmp_path / "run" / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "run" / "final" / "meta.json").write_text(json.dumps({"settings": {"data": "x"},
                                                                      "train_tokens": 999}))
    files = export.export(ck, str(tmp_path / "hf"))
    assert {"config.json", "model.safetensors", "growcram_model.py", "modeling_growcram.py",
            "README.md"} <= set(files)
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "steps: 123" in card and "final_val_loss: 4.5" in card and "999" in card
    assert "AutoModelForMaskedLM.from_pretrained" in card
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["growcram"] == model.load_model(ck).config        # our keys, readable back
    assert config["mask_token_id"] == enc.encode_single_token("[MASK]")
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


@pytest.mark.skipif(not HAS_HF_TOKENIZER, reason="needs tokenizer.save_hf_tokenizer (branch "
                                                 "hf-tokenizer)")
def test_fill_mask_pipeline_agrees_with_model_fill_mask(tmp_path, enc):
    net = seeded_model(tiny(vocab_size=enc.n_vocab))
    out = exported(tmp_path, net, enc=enc)
    fill = transformers.pipeline("fill-mask", model=out, tokenizer=out, trust_remote_code=True)
    text = "the cat sat on the [MASK]."
    ours = model.fill_mask(net, enc, text, top_k=5)[0]
    # the pipeline's softmax runs over every token, ours over ordinary ones: compare the ordinary
    # tokens in order, and the probabilities up to that renormalization
    specials = enc.special_tokens_set
    theirs = [g for g in fill(text, top_k=40) if g["token_str"] not in specials][:5]
    assert [g["token_str"].strip() for g in theirs] == [t.strip() for t, _ in ours]
    ratio = [g["score"] / p for g, (_, p) in zip(theirs, ours)]
    assert max(ratio) - min(ratio) < 1e-4 * max(ratio)


def test_refusals_are_one_line_errors(tmp_path, monkeypatch, capsys):
    ck = tmp_path / "ck"
    model.save_model(seeded_model(tiny()), str(ck))
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    cases = [(tmp_path / "nothing", "no such checkpoint folder"), (ck, "not empty")]
    for checkpoint, message in cases:
        with pytest.raises(ValueError, match=message):
            export.export(str(checkpoint), str(out))
    with pytest.raises(ValueError, match="would overwrite the checkpoint"):
        export.export(str(ck), str(ck), force=True)
    export.export(str(ck), str(out), force=True)     # --force replaces it
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").exists()
    # damaged files: a cut model.pt, a config.json that is not JSON, a missing model.pt
    weights = (ck / "model.pt").read_bytes()
    (ck / "model.pt").write_bytes(weights[:len(weights) // 2])
    with pytest.raises(ValueError, match="model.pt: damaged"):
        export.export(str(ck), str(tmp_path / "a"))
    (ck / "model.pt").unlink()
    with pytest.raises(ValueError, match="model.pt: missing"):
        export.export(str(ck), str(tmp_path / "a"))
    (ck / "config.json").write_text("{not json")
    (ck / "model.pt").write_bytes(weights)
    with pytest.raises(SystemExit, match="^error: .*config.json: damaged"):
        export.main([str(ck), str(tmp_path / "a")])
    assert not (tmp_path / "a").exists()
    # transformers missing: None in sys.modules makes its import raise ImportError
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ValueError, match="pip install transformers"):
        export.export(str(ck), str(tmp_path / "a"))


def test_a_failure_midway_leaves_no_folder(tmp_path, monkeypatch):
    ck = tmp_path / "ck"
    model.save_model(seeded_model(tiny()), str(ck))
    monkeypatch.setattr(export, "model_card", lambda *a: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        export.export(str(ck), str(tmp_path / "hf"))
    assert os.listdir(tmp_path) == ["ck"]


def test_glue_save_model_exports_a_named_classifier(tmp_path, enc):
    import evaluate_glue
    ck = save_checkpoint(seeded_model(tiny(vocab_size=enc.n_vocab)), enc, tmp_path / "ck")
    rows = [f"the cat sat {i}\t{['neg', 'pos'][i % 2]}" for i in range(12)]
    (tmp_path / "mood.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    evaluate_glue.evaluate(ck, None, {"task_file": str(tmp_path / "mood.tsv"), "seeds": 1,
                                      "epochs": 1, "batch_size": 4, "progress": False,
                                      "save_model": str(tmp_path / "tuned")})
    saved = tmp_path / "tuned" / "mood"
    assert json.loads((saved / "labels.json").read_text()) == ["neg", "pos"]
    out = export.export(str(saved), str(tmp_path / "hf")) and str(tmp_path / "hf")
    hf = AutoModelForSequenceClassification.from_pretrained(out, trust_remote_code=True).eval()
    assert hf.config.id2label == {0: "neg", 1: "pos"}
    tok = transformers.AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    inputs = tok(["the cat sat", "the dog ran in the park."], padding=True, return_tensors="pt")
    net = model.load_model(str(saved)).eval()
    with torch.no_grad():
        assert torch.allclose(hf(**inputs).logits, net.classify(**inputs)["logits"], atol=1e-4)


def test_train_init_from_an_exported_folder_starts_with_its_weights(sample_cache, tmp_path):
    """Continued pretraining from a folder transformers also loads: train.py --init-from OUT."""
    import train
    common = ["--data", "sample", "--vocab-size", "512", "--model", "tiny", "--max-seq-len", "32",
              "--micro-batch", "4", "--batch-tokens", "256", "--eval-batches", "2",
              "--cache", sample_cache]
    first = train.main([*common, "--max-steps", "10", "--out", str(tmp_path / "first")])
    export.export(str(tmp_path / "first" / "final"), str(tmp_path / "hf"))
    assert os.path.isfile(tmp_path / "hf" / "growcram_tokenizer.json")
    second = train.main([*common, "--max-steps", "3", "--out", str(tmp_path / "second"),
                         "--init-from", str(tmp_path / "hf")])
    with open(tmp_path / "second" / "log.jsonl") as f:
        start = json.loads(f.readline())
    assert start["step"] == 0 and start["val_loss"] == pytest.approx(first["final_val_loss"],
                                                                     abs=1e-5)
    assert second["steps"] == 3
