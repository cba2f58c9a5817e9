"""The weights' moving average (ema.py): what it computes, that train.py evaluates and saves it
while training goes on with the optimizer's weights, and that it survives a kill and a resume,
growth and the flags' checks."""
import json
import re

import pytest
import torch

import conftest
import ema
import flags
from conftest import seeded_model
from test_train import chosen, killed_at_its_first_checkpoint, run, weights


def test_a_new_average_equals_the_weights_and_decay_zero_is_off():
    net = seeded_model(conftest.tiny())
    average = ema.start(net, 0.99)
    assert all(torch.equal(a, p) for a, p in zip(average["weights"], net.parameters()))
    assert ema.start(net, 0.0) is None
    ema.update(None, net)                                     # off: nothing to do
    with ema.swapped_in(net, None) as same:
        assert same is net


def test_the_decay_warms_up_then_stays_at_its_value():
    average = {"decay": 0.99, "updates": 0, "weights": []}
    warm = []
    for n in (0, 1, 10, 100, 1000):
        average["updates"] = n
        warm.append(ema.current_decay(average))
    assert warm == pytest.approx([1 / 10, 2 / 11, 11 / 20, 101 / 110, 0.99])


def test_the_span_follows_the_learning_rate_down_to_the_weights_themselves():
    average = {"decay": 0.99, "updates": 10_000, "weights": []}
    spans = [1 / (1 - ema.current_decay(average, rate)) for rate in (1.0, 0.5, 0.1)]
    assert spans == pytest.approx([100, 50, 10])            # 1 / (1 - decay) steps times rate
    assert ema.current_decay(average, 0.01) == 0.0          # a step or less: no averaging
    assert ema.current_decay(average, 0.0) == 0.0
    net = torch.nn.Linear(3, 2)
    average = ema.start(net, 0.99)
    with torch.no_grad():
        net.weight.add_(1.0)
    ema.update(average, net, rate=0.0)                      # the end of a decay to zero
    assert torch.equal(average["weights"][0], net.weight)


def test_an_update_moves_the_average_toward_the_weights_by_one_minus_the_decay():
    net = torch.nn.Linear(3, 2)
    average = ema.start(net, 0.5)
    before = [w.clone() for w in average["weights"]]
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    ema.update(average, net)                                  # first update: decay 0.1
    for old, new, p in zip(before, average["weights"], net.parameters()):
        assert torch.allclose(new, 0.1 * old + 0.9 * p.detach())
    assert average["updates"] == 1


def test_inside_swapped_in_the_net_holds_the_average_and_after_it_its_own_weights_again():
    net = seeded_model(conftest.tiny())
    trained = {k: v.clone() for k, v in net.state_dict().items()}
    average = ema.start(net, 0.9)
    for w in average["weights"]:
        w.mul_(0.5)
    with pytest.raises(RuntimeError, match="inside"):
        with ema.swapped_in(net, average):
            assert all(torch.equal(p, w) for p, w in zip(net.parameters(), average["weights"]))
            raise RuntimeError("inside")                      # an evaluation that fails
    assert all(torch.equal(net.state_dict()[k], trained[k]) for k in trained)


def test_the_average_of_noisy_steps_sits_closer_to_the_minimum_than_the_last_step():
    # SGD on |w|^2 / 2 with noisy gradients at a constant rate: the iterate keeps jumping around
    # the minimum at 0, and its average over about 100 steps sits much closer to it.
    torch.manual_seed(0)
    net = torch.nn.Linear(100, 1, bias=False)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    average = ema.start(net, 0.99)
    for _ in range(2000):
        net.weight.grad = net.weight.detach() + torch.randn_like(net.weight)
        optimizer.step()
        ema.update(average, net)
    last = net.weight.detach().square().sum().item()
    averaged = average["weights"][0].square().sum().item()
    assert last > 2.0 and averaged < last / 5  # theory: about 1/11 of the variance


def test_the_state_dict_round_trips():
    net = seeded_model(conftest.tiny())
    average = ema.start(net, 0.99)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.01)
    for _ in range(3):
        ema.update(average, net)
    saved = ema.state_dict(average)
    again = ema.start(seeded_model(conftest.tiny(), seed=1), 0.99)
    ema.load_state_dict(again, saved)
    assert again["updates"] == 3
    assert all(torch.equal(a, b) for a, b in zip(again["weights"], average["weights"]))
    assert ema.state_dict(None) is None


# --- in train.py ---------------------------------------------------------------------------

def test_final_holds_the_average_and_the_checkpoint_both(sample_cache, tmp_path):
    # a constant rate: the average keeps its full span to the end
    run(sample_cache, tmp_path / "averaged", "--max-steps", "30", "--ema", "0.9", "--grow", "none",
        "--schedule", "constant")
    saved = torch.load(tmp_path / "averaged" / "checkpoint.pt", weights_only=False)
    final = weights(tmp_path / "averaged" / "final")
    names = list(saved["model"])
    average = dict(zip([n for n in names if n in final], saved["average"]["weights"]))
    assert saved["average"]["updates"] == 30
    assert all(torch.equal(final[k], average[k]) for k in average)
    assert not all(torch.equal(final[k], saved["model"][k]) for k in average)  # trained on
    run(sample_cache, tmp_path / "plain", "--max-steps", "30", "--ema", "0", "--grow", "none")
    saved = torch.load(tmp_path / "plain" / "checkpoint.pt", weights_only=False)
    final = weights(tmp_path / "plain" / "final")
    assert saved["average"] is None and all(torch.equal(final[k], saved["model"][k])
                                            for k in final)


def test_the_average_changes_what_is_scored_not_what_is_trained(sample_cache, tmp_path):
    on = run(sample_cache, tmp_path / "on", "--max-steps", "30", "--ema", "0.9", "--schedule",
             "constant")
    off = run(sample_cache, tmp_path / "off", "--max-steps", "30", "--ema", "0", "--schedule",
              "constant")
    trained_on = torch.load(tmp_path / "on" / "checkpoint.pt", weights_only=False)["model"]
    trained_off = torch.load(tmp_path / "off" / "checkpoint.pt", weights_only=False)["model"]
    assert all(torch.equal(trained_on[k], trained_off[k]) for k in trained_on)
    assert on["final_val_loss"] != off["final_val_loss"]


def test_at_the_end_of_a_decay_to_zero_the_average_is_the_trained_weights(sample_cache, tmp_path):
    # the default schedule falls linearly to zero: the last of 120 steps runs at 0.9% of the peak
    # rate, where the average spans under one step
    run(sample_cache, tmp_path, "--max-steps", "120", "--grow", "none", "--log-every", "60")
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    final = weights(tmp_path / "final")
    assert saved["average"]["decay"] == 0.99 and saved["average"]["updates"] == 120
    assert all(torch.equal(final[k], saved["model"][k]) for k in final)


def test_growth_starts_a_new_average_of_the_grown_model(sample_cache, tmp_path):
    run(sample_cache, tmp_path, "--max-steps", "40", "--grow", "0:layers=1; 0.5:layers=2",
        "--ema", "0.9")
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    model_shapes = [v.shape for k, v in saved["model"].items() if k in weights(tmp_path / "final")]
    assert [w.shape for w in saved["average"]["weights"]] == model_shapes   # two layers now
    assert saved["average"]["updates"] == 20                 # the steps since growth at 50%
    grow_event = [e for e in conftest.read_log(tmp_path) if e.get("kind") == "grow"][0]
    assert grow_event["val_loss_before"] != grow_event["val_loss_after"]


def test_a_run_killed_and_resumed_ends_with_the_same_average(sample_cache, tmp_path):
    flags_ = ["--max-steps", "80", "--checkpoint-steps", "10", "--log-every", "40", "--ema",
              "0.95"]
    run(sample_cache, tmp_path / "straight", *flags_)
    killed_at_its_first_checkpoint(sample_cache, tmp_path / "killed", *flags_)
    assert run(sample_cache, tmp_path / "killed", "--resume")["steps"] == 80
    a, b = weights(tmp_path / "straight" / "final"), weights(tmp_path / "killed" / "final")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_run_saved_before_the_flag_resumes_without_an_average(sample_cache, tmp_path):
    run(sample_cache, tmp_path, "--max-steps", "2", "--ema", "0")
    saved = json.loads((tmp_path / "args.json").read_text())
    del saved["ema"]                                       # as train.py wrote it before the flag
    (tmp_path / "args.json").write_text(json.dumps(saved))
    assert run(sample_cache, tmp_path, "--resume", "--max-steps", "3")["steps"] == 3
    assert json.loads((tmp_path / "args.json").read_text())["ema"] == 0.0
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=False)["average"] is None


def test_the_default_is_the_records_decay_under_ddp_and_fsdp():
    def picks(*argv):
        return chosen(["--max-steps", "1", "--model", "mini", *argv], flops_per_s=1e10,
                      on_gpu=False)
    assert picks()["ema"] == ema.RECIPE_DECAY == 0.99
    assert picks("--shard", "fsdp", "--grow", "none")["ema"] == 0.99   # tests/test_fsdp.py
    assert "ema" not in picks("--ema", "0.5")                            # a given one wins


@pytest.mark.parametrize("argv, message", [
    (["--ema", "1"], "--ema.*in \\[0, 1\\)"),
    (["--ema", "-0.1"], "--ema.*in \\[0, 1\\)"),
])
def test_bad_ema_flags_get_one_line(argv, message, capsys):
    with pytest.raises(SystemExit):
        flags.parse_args(["--max-steps", "1", *argv])
    assert re.search(message, capsys.readouterr().err.strip().splitlines()[-1])
