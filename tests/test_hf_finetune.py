"""Fine-tuning an export in Hugging Face transformers: every Auto class a user reaches for, the
Trainer, save_pretrained and back into growcram, and the ModernBERT family that exports as a stock
transformers model (no remote code).

Each export comes from a short train.py run on the sample corpus (train.py -> final/ -> export.py),
as a user's would.
"""
import json
import os

import pytest
import torch

pytest.importorskip("transformers", reason="export tests need transformers (optional for growcram)")
pytest.importorskip("safetensors", reason="export tests need safetensors (optional for growcram)")
os.environ["HF_HUB_OFFLINE"] = "1"  # everything loads from local folders

import transformers  # noqa: E402
from transformers import (  # noqa: E402
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
)

import export  # noqa: E402
import model  # noqa: E402
import tokenizer  # noqa: E402
import train  # noqa: E402

REMOTE = {"trust_remote_code": True}
TEXTS = ["the king is dead, long live the king.", "what light through yonder window breaks?"]


def trained_export(cache, folder, *flags):
    """A tiny model trained for 20 steps on the sample corpus, and its export: (final/, OUT)."""
    train.main(["--data", "sample", "--vocab-size", "512", "--model", "tiny", "--max-seq-len",
                "32", "--micro-batch", "4", "--batch-tokens", "256", "--eval-batches", "2",
                "--max-steps", "20", "--cache", cache, "--out", str(folder), *flags])
    final, out = str(folder / "final"), str(folder / "hf")
    export.export(final, out)
    return final, out


@pytest.fixture(scope="module")
def mlm(sample_cache, tmp_path_factory):
    return trained_export(sample_cache, tmp_path_factory.mktemp("mlm"))


@pytest.fixture(scope="module")
def modernbert(sample_cache, tmp_path_factory):
    return trained_export(sample_cache, tmp_path_factory.mktemp("modernbert"), "--arch",
                          "modernbert")


def encode(out, texts=TEXTS):
    tok = AutoTokenizer.from_pretrained(out)
    return tok, tok(texts, padding=True, return_tensors="pt")


def ours_encode(final, inputs):
    net = model.load_model(final).eval()
    with torch.no_grad():
        return net, net.encode(inputs["input_ids"], inputs["attention_mask"])


def test_every_auto_class_loads_one_masked_lm_export(mlm):
    final, out = mlm
    tok, inputs = encode(out)
    net, hidden = ours_encode(final, inputs)
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        # AutoModel: the trunk's hidden states after the final norm, as net.encode
        trunk = AutoModel.from_pretrained(out, **REMOTE).eval()
        assert torch.allclose(trunk(**inputs).last_hidden_state[real], hidden[real], atol=1e-5)
        lm = AutoModelForMaskedLM.from_pretrained(out, **REMOTE).eval()
        ours = net.logits(hidden)[..., :net.config["vocab_size"]]
        assert torch.allclose(lm(**inputs).logits[real], ours[real], atol=1e-4)
        # a fresh head of num_labels outputs on the pretrained trunk; 1 output is a regression
        for n, labels in [(3, torch.tensor([0, 2])), (1, torch.tensor([0.5, 4.0]))]:
            cls = AutoModelForSequenceClassification.from_pretrained(out, num_labels=n, **REMOTE)
            result = cls.eval()(**inputs, labels=labels)
            assert result.logits.shape == (2, n) and torch.isfinite(result.loss)
            expected = torch.nn.functional.mse_loss(result.logits.squeeze(-1), labels) if n == 1 \
                else torch.nn.functional.cross_entropy(result.logits, labels)
            assert result.loss.item() == pytest.approx(expected.item(), rel=1e-5)
        # ModernBERT's name for the pooling chooses ours: the mean of the real tokens
        mean = AutoModelForSequenceClassification.from_pretrained(
            out, num_labels=2, classifier_pooling="mean", **REMOTE)
        assert mean.growcram.config["pooling"] == "mean" and mean.config.growcram["num_labels"] == 2
        tagger = AutoModelForTokenClassification.from_pretrained(out, num_labels=5, **REMOTE)
        tags = torch.where(real, 1, -100)
        result = tagger.eval()(**inputs, labels=tags)
        assert result.logits.shape == (*inputs["input_ids"].shape, 5)
        assert torch.isfinite(result.loss)
    # the two pipelines a user starts from
    features = transformers.pipeline("feature-extraction", model=out, tokenizer=out, **REMOTE)
    first = torch.tensor(features(TEXTS[0])[0])                                      # (T, d)
    assert torch.allclose(first, hidden[0][real[0]], atol=1e-5)
    fill = transformers.pipeline("fill-mask", model=out, tokenizer=out, **REMOTE)
    guesses = fill("the king is [MASK].", top_k=3)
    assert len(guesses) == 3 and all(0 <= g["score"] <= 1 for g in guesses)


def test_the_tokenizer_loads_without_remote_code_and_a_causal_one_appends_nothing(
        mlm, sample_cache, tmp_path):
    _, out = mlm
    tok = AutoTokenizer.from_pretrained(out)          # tokenizer_class is a stock class
    ids = tok("the king")["input_ids"]
    assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
    _, causal = trained_export(sample_cache, tmp_path / "clm", "--objective", "clm")
    tok = AutoTokenizer.from_pretrained(causal)
    enc = tokenizer.load_tokenizer(os.path.join(causal, "growcram_tokenizer.json"))
    sep = tokenizer.special_ids(enc)["sep"]
    # a prompt starts after a [SEP], as a document does in a decoder's training stream, and ends
    # with its own last token: nothing appended
    assert tok("the king")["input_ids"] == [sep, *enc.encode_ordinary("the king")]
    lm = AutoModelForCausalLM.from_pretrained(causal, **REMOTE).eval()
    prompt = tok("the king", return_tensors="pt")
    new = lm.generate(**prompt, max_new_tokens=5)
    assert new.shape[1] > prompt["input_ids"].shape[1]
    assert AutoModel.from_pretrained(causal, **REMOTE) is not None


def glue_like_task(folder):
    """A GLUE-format TSV (sentence, label): 'king' sentences are 1, the rest 0."""
    rows = [(f"the king is {w} and old.", 1) for w in ("here", "dead", "gone", "away", "near")] + \
           [(f"a dog ran {w} in the sun.", 0) for w in ("here", "far", "home", "out", "fast")]
    path = folder / "train.tsv"
    path.write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows * 2))
    return str(path)


def read_tsv(path):
    with open(path) as f:
        next(f)
        return [(s, int(y)) for s, y in (line.rstrip("\n").split("\t") for line in f)]


def test_trainer_fine_tunes_an_export_and_the_saved_folder_comes_back(mlm, sample_cache,
                                                                      tmp_path):
    pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate")
    import evaluate_glue
    final, out = mlm
    rows = read_tsv(glue_like_task(tmp_path))
    tok = AutoTokenizer.from_pretrained(out)
    net = AutoModelForSequenceClassification.from_pretrained(out, num_labels=2, **REMOTE)
    data = [{**tok(s, truncation=True), "labels": y} for s, y in rows]
    args = transformers.TrainingArguments(str(tmp_path / "trainer"), max_steps=30,
                                          per_device_train_batch_size=4, learning_rate=3e-3,
                                          logging_steps=5, save_strategy="no", report_to=[],
                                          use_cpu=True, seed=0)
    trainer = transformers.Trainer(model=net, args=args, train_dataset=data,
                                   data_collator=transformers.DataCollatorWithPadding(tok))
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses[-1] < 0.5 * losses[0]
    # save_pretrained, then every growcram entry point reads the folder
    tuned = str(tmp_path / "tuned")
    trainer.save_model(tuned)
    tok.save_pretrained(tuned)
    back = export.load_exported(tuned)
    assert back.config["num_labels"] == 2
    inputs = tok(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        theirs = net.eval()(**inputs).logits
        assert torch.allclose(back.classify(**inputs)["logits"], theirs, atol=1e-5)
    results = evaluate_glue.evaluate(tuned, None, {"task_file": glue_like_task(tmp_path),
                                                   "seeds": 1, "epochs": 1, "progress": False})
    assert results["tasks"]
    run = train.main(["--data", "sample", "--vocab-size", "512", "--max-seq-len", "32",
                      "--micro-batch", "4", "--batch-tokens", "256", "--eval-batches", "2",
                      "--max-steps", "2", "--cache", sample_cache, "--init-from", tuned,
                      "--out", str(tmp_path / "continued")])
    assert run["steps"] == 2


def test_modernbert_arch_exports_as_a_stock_modernbert(modernbert, tmp_path):
    final, out = modernbert
    config = json.loads(open(os.path.join(out, "config.json")).read())
    assert config["model_type"] == "modernbert" and "auto_map" not in config
    assert not [f for f in os.listdir(out) if f.endswith(".py")]        # no remote code at all
    tok, inputs = encode(out)
    net, hidden = ours_encode(final, inputs)
    real = inputs["attention_mask"].bool()
    lm = AutoModelForMaskedLM.from_pretrained(out).eval()               # no trust_remote_code
    assert type(lm).__name__ == "ModernBertForMaskedLM"
    with torch.no_grad():
        theirs, ours = lm(**inputs).logits, net.logits(hidden)
    assert torch.allclose(theirs[real], ours[real], atol=1e-4)
    back = export.load_exported(out)
    with torch.no_grad():
        assert torch.equal(back.logits(back.encode(**inputs)), ours)
    # ModernBERT's own classifier fine-tunes it: 20 steps on one batch learn its two labels
    cls = AutoModelForSequenceClassification.from_pretrained(out, num_labels=2)
    assert type(cls).__name__ == "ModernBertForSequenceClassification"
    labels = torch.tensor([1, 0])
    optimizer = torch.optim.AdamW(cls.parameters(), lr=3e-3)
    losses = []
    for _ in range(20):
        loss = cls.train()(**inputs, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.1 < losses[0]
    cls.save_pretrained(str(tmp_path / "tuned"))
    trunk = export.load_exported(str(tmp_path / "tuned"))  # its trunk comes back into growcram
    with torch.no_grad():
        want = cls.model(**inputs).last_hidden_state
        assert torch.allclose(trunk.encode(**inputs)[real], want[real], atol=1e-5)


@pytest.mark.parametrize("overrides", [{}, {"bias": True}, {"n_layers": 3, "dropout": 0.0}],
                         ids=["modernbert", "with-biases", "three-layers"])
def test_modernbert_logits_equal_transformers_at_every_size(tmp_path, overrides):
    cfg = model.make_config("tiny", arch="modernbert", vocab_size=90, d_model=32, n_heads=4,
                            ffn_dim=48, max_seq_len=32, **overrides)
    torch.manual_seed(0)
    net = model.build_model(cfg).eval()
    for p in net.parameters():   # norms and biases away from 1 and 0, so a misplaced one shows
        p.data += 0.1 * torch.randn_like(p)
    model.save_model(net, str(tmp_path / "ck"))
    export.export(str(tmp_path / "ck"), str(tmp_path / "hf"))
    lm = AutoModelForMaskedLM.from_pretrained(str(tmp_path / "hf")).eval()
    ids = torch.randint(0, 90, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 7:] = 0
    with torch.no_grad():
        theirs = lm(input_ids=ids, attention_mask=mask).logits
        ours = net.logits(net.encode(ids, mask))
    assert torch.allclose(theirs[mask.bool()], ours[mask.bool()], atol=1e-4)
