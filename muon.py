"""Muon for the hidden matrices, AdamW for the rest: one optimizer, as nanochat splits the work.

    optimizer = muon.MuonAdamW(muon.param_groups(net, weight_decay=0.01), lr=1e-3)

Muon (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks") keeps
SGD-momentum on each 2-D weight of the transformer blocks and replaces the update by an approximate
orthogonalization of it (five Newton-Schulz iterations): every direction of the matrix moves by
about the same amount, instead of the few large ones that dominate a raw gradient. The embedding,
the tied output head, the norms and the scalars stay on AdamW (Loshchilov & Hutter 2019). Muon's
step is scaled by 0.2 * sqrt(max(rows, cols)) (Liu et al. 2025, "Muon is scalable for LLM
training", Section 2.2) so that its update has AdamW's RMS, 0.2 lr, and both halves share one
learning rate and one schedule. update_rms sets that 0.2: a larger one steps the matrices faster
than the embedding at the same lr.

neuron_beta2 > 0 adds NorMuon (Li et al. 2025, "NorMuon: Making Muon more efficient and scalable"):
the orthogonalized update moves every direction of a matrix by about as much, but not every output
neuron (row), so each row is divided by a running root-mean-square of its own, as Adam does per
coordinate, and the update keeps its norm (normalize_neurons). train.py's default since the
speedrun's record 9 (docs/records.md).

Why our own ~60 lines when torch.optim.Muon exists (the tests check that both take the same
step to within bf16 rounding): train.py, grow.py and checkpoint.py each need ONE optimizer object
(its param_groups set by the schedule, its state mapped by growth, its state_dict saved and
resharded by Distributed Checkpoint), and torch.optim.Muon only takes matrices. And torch's runs
its Newton-Schulz matmuls in bf16 always, which a CPU without bf16 instructions emulates about 50x
slower than fp32; here the dtype is the caller's (train.py passes its autocast dtype).

Under DDP each rank holds the whole, all-reduced gradient, so every rank takes the same step. Under
FSDP2 a rank holds a shard of each matrix, and the orthogonalization of a shard is not a shard of
the orthogonalization: train.py falls back to AdamW there (see train.make_optimizer).
"""
import torch

# The quintic Newton-Schulz coefficients of Jordan et al. 2024 (chosen to maximise the slope at
# zero; the result has singular values in about [0.7, 1.2] rather than exactly 1, which trains as
# well), and its five iterations.
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
# The recipe's Nesterov momentum: train.py's default, and evaluate_glue's when it fine-tunes with
# Muon (the speedrun's record 2, measured against 0.6-0.95 in docs/records.md; Jordan et al. 2024,
# and MuonAdamW's own default, use 0.95).
RECIPE_MOMENTUM = 0.7
# The recipe's NorMuon decay (normalize_neurons): train.py's default since the speedrun's record 9,
# NorMuon's own value (Li et al. 2025); MuonAdamW's default, 0, is plain Muon.
RECIPE_NEURON_BETA2 = 0.95


def param_groups(net, weight_decay):
    """The three groups: the blocks' 2-D weights on Muon (decayed), the other tensors of two or more
    dimensions on AdamW (decayed: the embedding and the tied head), the rest on AdamW undecayed
    (norms, biases, scalars: cramming's limited_decay_keys)."""
    params = [(name, p) for name, p in net.named_parameters() if p.requires_grad]
    hidden = [p for name, p in params if is_hidden_matrix(name, p)]
    matrices = [p for name, p in params if not is_hidden_matrix(name, p) and p.dim() >= 2]
    small = [p for name, p in params if p.dim() < 2]
    return [{"params": hidden, "use_muon": True, "weight_decay": weight_decay},
            {"params": matrices, "use_muon": False, "weight_decay": weight_decay},
            {"params": small, "use_muon": False, "weight_decay": 0.0}]


def is_hidden_matrix(name, p):
    """Whether Muon steps this parameter: a 2-D weight inside the transformer blocks."""
    return name.startswith("blocks.") and p.dim() == 2


def orthogonalize(g, dtype=torch.float32, steps=NS_STEPS):
    """About U V^T for g = U S V^T, by Newton-Schulz iteration in `dtype`. g: (rows, cols), or
    (n, rows, cols): n matrices of one shape, each orthogonalized on its own, in batched matmuls."""
    a, b, c = NS_COEFFICIENTS
    x = g.to(dtype).reshape(-1, *g.shape[-2:])                               # (n, rows, cols)
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT  # iterate on the short side: the Gram matrix x @ x.T is then the small one
    # The Frobenius norm bounds the spectral norm: every singular value s <= 1.
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=1e-7)
    for _ in range(steps):
        # x <- a x + (b gram + c gram @ gram) @ x, s -> a s + b s^3 + c s^5 on each singular
        # value; baddbmm folds each sum into its matmul (1.5x faster at 4 x 128's shapes, bf16).
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return (x.mT if tall else x).reshape(g.shape).to(g.dtype)


class MuonAdamW(torch.optim.Optimizer):
    """Muon on the groups marked use_muon, AdamW on the others (see the module docstring).

    lr: both halves' learning rate; update_rms: the RMS of Muon's update per unit of lr (0.2:
    AdamW's); momentum: Muon's (Nesterov); betas, eps: AdamW's; weight_decay: decoupled, per group;
    ns_dtype: the Newton-Schulz dtype; ns_steps: its iterations; neuron_beta2: NorMuon's decay of
    each row's second moment (0: plain Muon)."""

    def __init__(self, groups, lr, momentum=0.95, betas=(0.9, 0.98), eps=1e-12,
                 weight_decay=0.0, ns_dtype=torch.float32, update_rms=0.2, neuron_beta2=0.0,
                 ns_steps=NS_STEPS):
        defaults = {"lr": lr, "momentum": momentum, "betas": tuple(betas), "eps": eps,
                    "weight_decay": weight_decay, "use_muon": False, "neuron_beta2": neuron_beta2}
        super().__init__(groups, defaults)
        self.ns_dtype, self.update_rms, self.ns_steps = ns_dtype, update_rms, ns_steps

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if group["use_muon"]:
                # The matrices of one shape (one weight of every block) step together, in batched
                # matmuls: at 4 x 128 a Newton-Schulz iteration per matrix is a few small matmuls
                # whose calls cost more than their arithmetic (16 matrices in 4 shapes, bf16,
                # 2 CPU cores: the optimizer step 13.3 ms one by one, 8.8 ms batched with
                # orthogonalize's baddbmm; docs/records.md, eighteenth session).
                for shape in dict.fromkeys(p.shape for p in params):
                    same = [p for p in params if p.shape == shape]
                    muon_update(same, [self.state[p] for p in same], group, self.ns_dtype,
                                self.update_rms, self.ns_steps)
            else:
                for p in params:
                    adamw_update(p, p.grad, self.state[p], group)


def muon_update(params, states, group, ns_dtype, update_rms, ns_steps):
    """One Muon step on matrices of one shape: Nesterov momentum, orthogonalized, decoupled weight
    decay. states: each one's optimizer state."""
    lr, mu = group["lr"], group["momentum"]
    for p, state in zip(params, states):
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p)
        state["momentum_buffer"].lerp_(p.grad, 1 - mu)  # buf = mu * buf + (1 - mu) * grad
    # Nesterov, looking one step ahead: (n, rows, cols), every matrix's direction at once.
    ahead = torch.stack([p.grad.lerp(state["momentum_buffer"], mu)
                         for p, state in zip(params, states)])
    directions = orthogonalize(ahead, ns_dtype, ns_steps)
    if group.get("neuron_beta2", 0.0) > 0:  # a checkpoint from before NorMuon has no such key
        directions = normalize_neurons(directions, states, group["neuron_beta2"])
    for p, direction in zip(params, directions):
        p.mul_(1 - lr * group["weight_decay"])
        # An orthogonal (A, B) matrix has RMS 1/sqrt(max(A, B)): scaled, the update's RMS is
        # update_rms * lr.
        p.add_(direction, alpha=-lr * update_rms * max(p.shape) ** 0.5)


def normalize_neurons(directions, states, beta2):
    """NorMuon (Li et al. 2025, "NorMuon: Making Muon more efficient and scalable"): an
    orthogonalized update still gives some output neurons (rows) larger steps than others; a
    running mean of each row's mean square (beta2) evens them out, as Adam does per coordinate,
    and the update keeps its Frobenius norm, so lr and update_rms mean what they meant.
    directions: (n, rows, cols); each state keeps its rows' second moment, (rows, 1)."""
    d = directions.float()
    row_square = d.square().mean(dim=-1, keepdim=True)                           # (n, rows, 1)
    for state, square in zip(states, row_square):
        if "neuron_second_moment" not in state:
            state["neuron_second_moment"] = torch.zeros_like(square)
        state["neuron_second_moment"].lerp_(square, 1 - beta2)
    moments = torch.stack([state["neuron_second_moment"] for state in states])   # (n, rows, 1)
    evened = d / moments.sqrt().add_(1e-10)
    scale = d.norm(dim=(-2, -1), keepdim=True) / evened.norm(dim=(-2, -1), keepdim=True).add_(1e-10)
    return (evened * scale).to(directions.dtype)


def adamw_update(p, grad, state, group):
    """One AdamW step (Loshchilov & Hutter 2019), as torch.optim.AdamW takes it."""
    lr, (b1, b2) = group["lr"], group["betas"]
    if "step" not in state:
        # on the CPU whatever p's device, as torch.optim.AdamW keeps it (not fused, not capturable),
        # and Optimizer.load_state_dict leaves "step" where it is: .item() below is no device sync
        state["step"] = torch.zeros((), dtype=torch.float32)
        state["exp_avg"] = torch.zeros_like(p)
        state["exp_avg_sq"] = torch.zeros_like(p)
    state["step"] += 1
    t = state["step"].item()
    state["exp_avg"].lerp_(grad, 1 - b1)
    state["exp_avg_sq"].mul_(b2).addcmul_(grad, grad, value=1 - b2)
    p.mul_(1 - lr * group["weight_decay"])
    denominator = (state["exp_avg_sq"].sqrt() / (1 - b2 ** t) ** 0.5).add_(group["eps"])
    p.addcdiv_(state["exp_avg"], denominator, value=-lr / (1 - b1 ** t))
