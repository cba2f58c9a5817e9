"""Specification of evaluate_lm.py (zero-shot): python -m pytest -q tests/test_evaluate_lm.py

Tiny models and a tokenizer built here. The scores are checked against explicit computations: the
batched log-likelihood against a per-token loop, the pseudo-log-likelihood against one masked
forward pass per token, acc_norm on a case where length normalisation flips the answer, and
last-word accuracy on a memorized sentence.
"""
import json

import pytest
import torch

import data
import evaluate_lm
import tokenizer
from conftest import SENTENCE, save_checkpoint, seeded_model, tiny


def tiny_model(enc, **overrides):
    """conftest's seeded tiny model with enc's vocabulary."""
    return seeded_model(tiny(vocab_size=enc.n_vocab, **overrides))


@pytest.fixture(scope="module")
def memorized(enc):
    """A causal LM that has memorized SENTENCE as a document (after [SEP])."""
    net = tiny_model(enc, objective="clm", positions="rotary").train()
    doc = [tokenizer.special_ids(enc)["sep"]] + enc.encode_ordinary(SENTENCE)
    ids = torch.tensor(doc).repeat(8, 1)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    for _ in range(150):
        loss = net(ids[:, :-1], labels=ids[:, 1:])["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
    return net.eval()


def test_causal_log_likelihood_equals_a_token_by_token_sum(enc):
    net, specials = tiny_model(enc, objective="clm"), tokenizer.special_ids(enc)
    ctx = enc.encode_ordinary("the cat")
    conts = [enc.encode_ordinary(" sat on"), enc.encode_ordinary(" ran")]
    scores = evaluate_lm.score_causal(net, specials, ctx, conts)
    for (lp, _), c in zip(scores, conts):
        seq, expected = [specials["sep"]] + ctx, 0.0
        for token in c:  # one forward pass per token, no batching, no padding
            logits = net(torch.tensor([seq]))["logits"][0, -1].float()
            expected += logits.log_softmax(-1)[token].item()
            seq.append(token)
        assert lp == pytest.approx(expected, abs=1e-4)


def test_pseudo_log_likelihood_equals_one_masked_pass_per_token(enc):
    net, sp = tiny_model(enc), tokenizer.special_ids(enc)
    ctx, cont = enc.encode_ordinary("the cat"), enc.encode_ordinary(" sat on the mat")
    (lp, _), = evaluate_lm.score_masked(net, sp, ctx, [cont])
    row, expected = [sp["cls"]] + ctx + cont + [sp["sep"]], 0.0
    for i in range(len(cont)):
        masked = list(row)
        masked[1 + len(ctx) + i] = sp["mask"]
        logits = net(torch.tensor([masked]))["logits"][0, 1 + len(ctx) + i].float()
        expected += logits.log_softmax(-1)[cont[i]].item()
    assert lp == pytest.approx(expected, abs=1e-4)


def test_acc_norm_divides_by_characters_and_can_flip_the_answer():
    # A long choice with a higher total but a lower per-character log-probability.
    assert evaluate_lm.pick([-6.0, -4.0], ["a much longer answer", "no"]) == (1, 0)
    assert evaluate_lm.pick([-1.0, -4.0], ["yes", "no"]) == (0, 0)


def test_continuation_is_the_choice_after_a_space():
    assert evaluate_lm.continuation("the cat", "sat") == " sat"
    assert evaluate_lm.continuation("the cat ", "sat") == "sat"
    assert evaluate_lm.continuation("x", " y") == " y"


def test_last_word_of_a_memorized_sentence_is_predicted_greedily(memorized, enc):
    metrics, items = evaluate_lm.evaluate_items(memorized, enc, "last_word", [{"text": SENTENCE}],
                                                progress=False)
    assert metrics["acc"] == 100.0 and items[0]["logprob"] > -1.0
    other_ending = [{"text": "the cat sat on the tree."}]
    metrics, _ = evaluate_lm.evaluate_items(memorized, enc, "last_word", other_ending,
                                            progress=False)
    assert metrics["acc"] == 0.0 and metrics["perplexity"] > 2.0


def test_multiple_choice_picks_the_memorized_ending_and_writes_both_result_files(memorized, enc,
                                                                                 tmp_path):
    path = tmp_path / "mc.jsonl"
    item = {"context": "the cat sat on the", "choices": ["tree.", "mat."], "label": 1}
    path.write_text(json.dumps(item) + "\n")
    folder = save_checkpoint(memorized, enc, tmp_path / "ckpt")
    result = evaluate_lm.main(["--checkpoint", folder, "--task-file", str(path), "--no-progress",
                               "--out", str(tmp_path / "out")])
    assert result["tasks"]["mc"]["metrics"] == {"acc": 100.0, "acc_norm": 100.0}
    assert result["scoring"] == "log-likelihood"
    assert json.loads((tmp_path / "out" / "results.json").read_text())["tasks"]["mc"]["n"] == 1
    table = (tmp_path / "out" / "results.md").read_text()
    assert "| mc | multiple choice | 1 | 100.00 | 100.00 |" in table


def test_masked_models_are_scored_by_pll_and_say_so(enc, tmp_path):
    path = tmp_path / "mc.jsonl"
    item = {"context": "the cat", "choices": ["sat", "ran"], "label": 0}
    path.write_text(json.dumps(item) + "\n")
    folder = save_checkpoint(tiny_model(enc), enc, tmp_path / "ckpt")
    result = evaluate_lm.main(["--checkpoint", folder, "--task-file", str(path), "--no-progress"])
    assert result["scoring"].startswith("PLL")
    assert 0 <= result["tasks"]["mc"]["metrics"]["acc"] <= 100


@pytest.mark.parametrize("line,message", [
    ("{not json", ":1: not a JSON object"),
    ('{"context": "a", "choices": [], "label": 0}',
     ":1: \"choices\" must be a list of at least two"),
    ('{"context": "a", "choices": ["b", ""], "label": 0}',
     ":1: \"choices\" must be a list of at least two"),
    ('{"context": "a", "choices": ["b", "c"], "label": 2}',
     ":1: \"label\" must be an index into choices (0..1)"),
    ('{"context": "a", "choices": ["b", "c"], "label": true}', "\"label\" must be an index"),
    ('{"question": "a"}', ":1: needs \"context\""),
    ('{"text": "one"}', ":1: \"text\" must be a string of at least two words"),
])
def test_bad_task_lines_are_one_line_errors_naming_file_and_line(line, message, enc, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    folder = save_checkpoint(tiny_model(enc), enc, tmp_path / "ckpt")
    with pytest.raises(SystemExit) as stop:
        evaluate_lm.main(["--checkpoint", folder, "--task-file", str(path)])
    assert str(stop.value.code).startswith(f"error: {path}") and message in str(stop.value.code)
    assert "\n" not in str(stop.value.code)


def test_built_in_tasks_come_from_held_out_documents_only(tmp_path):
    docs = [{"text": f"Document {i} begins here today. It has a second sentence {i} now. "
                     f"And a third one about item {i % 5} ends it."} for i in range(200)]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in docs))
    meta = data.prepare_data(str(corpus), str(tmp_path / "cache"), {"vocab_size": 320},
                             progress=False)
    held_out = evaluate_lm.held_out_documents(meta["dir"])
    assert len(held_out) == meta["val_documents"] == 10  # every 20th document
    val_ids = {int(d.split()[1]) for d in held_out}
    assert val_ids == set(range(0, 200, 20))              # never a training document
    kind, items = evaluate_lm.build_cloze(held_out, n_items=5)
    again = evaluate_lm.build_cloze(held_out, n_items=5)[1]
    assert kind == "multiple_choice" and items == again and len(items) == 5   # deterministic
    for it in items:
        truth = it["choices"][it["label"]]
        assert len(it["choices"]) == 4 and truth in next(d for d in held_out if it["context"] in d)
    kind, items = evaluate_lm.build_last_word(held_out, n_items=3, words=10)
    assert kind == "last_word" and all(len(i["text"].split()) == 10 for i in items)


def test_built_in_tasks_need_the_held_out_folder(enc, tmp_path):
    folder = save_checkpoint(tiny_model(enc), enc, tmp_path / "ckpt")
    with pytest.raises(SystemExit, match="built-in tasks need --held-out"):
        evaluate_lm.main(["--checkpoint", folder, "--task", "cloze"])


def test_the_harness_adapter_scores_a_local_task_like_evaluate_lm(memorized, enc, tmp_path,
                                                                  monkeypatch):
    pytest.importorskip("lm_eval", reason="EleutherAI's harness is optional: pip install lm-eval")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    items = [{"context": "the cat sat on the", "choices": ["tree.", "mat.", "sun."], "label": 1},
             {"context": "the dog ran in the", "choices": ["park.", "cat."], "label": 0},
             {"context": "a bird sang on the", "choices": ["mat.", "tree."], "label": 1},
             {"context": "we sat in the", "choices": ["sun.", "sat."], "label": 0}]
    jsonl = tmp_path / "items.jsonl"
    jsonl.write_text("".join(json.dumps(i) + "\n" for i in items))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "local_mc.yaml").write_text(
        "task: growcram_local_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {jsonl}\ntest_split: test\noutput_type: multiple_choice\n"
        "doc_to_text: \"{{context}}\"\ndoc_to_choice: \"{{choices}}\"\n"
        "doc_to_target: \"{{label}}\"\n"
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n")
    folder = save_checkpoint(memorized, enc, tmp_path / "ckpt")
    harness = evaluate_lm.evaluate_harness(folder, ["growcram_local_mc"], include_path=str(tasks))
    ours = evaluate_lm.main(["--checkpoint", folder, "--task-file", str(jsonl), "--no-progress"])
    m = ours["tasks"]["items"]["metrics"]
    assert harness["growcram_local_mc"]["acc,none"] == pytest.approx(m["acc"] / 100)
    assert harness["growcram_local_mc"]["acc_norm,none"] == pytest.approx(m["acc_norm"] / 100)
