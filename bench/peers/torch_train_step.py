"""torch_train_step: PyTorch 2.x with torch.compile on the training step bench_train_step times.

The step: GPT-2 124M (12 layers, 12 heads, 768 channels, vocabulary 50257, block 64, lm_head
tied to wte, GELU tanh, LayerNorm eps 1e-5, no dropout), one batch of B=4 sequences of T=64
tokens, fp32: forward, cross-entropy, backward, the global gradient norm clipped at 1.0, and
torch.optim.AdamW (lr 6e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on the tensors of 2 or
more dimensions, as zshard does), fused=True (PyTorch's fastest CPU AdamW; the flat vector's
update in zshard is the same work).  That is the work of one `zshard train` step with
chunks = 1; bench_train_step counts the same flops for it (zs_gpt2_flops).

The model and the loss are compiled with torch.compile (inductor, default mode); the
backward is the compiled graph's (AOTAutograd).  The first steps compile (a minute or more on
2 cores) and are not timed.  Tokens are random, from a fixed seed.

usage:
  python torch_train_step.py [THREADS=2] [STEPS=5] [--eager]
      prints   torch_train_step: THREADS threads, B=4 T=64: best X ms (mean Y ms over STEPS),
               Z GFLOP/s   and last   torch_ms=X
  python torch_train_step.py --serve THREADS
      for bench/train_step_vs_torch.sh: compiles and warms up, prints "ready", then for every
      line N read from stdin runs N steps and prints "torch_ms=BEST" (best of the N).
Everything else (torch's warnings, compile logs) goes to stderr.

THREADS goes to OMP_NUM_THREADS before torch is imported and to torch.set_num_threads.
Never run by CI or the test suite: torch comes from the venv of bench/peers/make_venv.sh.
"""

import math
import os
import sys
import time

L, NH, C, V, T, B = 12, 12, 768, 50257, 64, 4


def flops(b, t):
    """zs_gpt2_flops: 6 x matmul weights x tokens (lm_head included) + 12 L t C per token."""
    weights = L * 12.0 * C * C + V * C
    return b * t * (6.0 * weights + 12.0 * L * t * C)


def build(torch, eager):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(C, eps=1e-5)
            self.c_attn = nn.Linear(C, 3 * C)
            self.attn_proj = nn.Linear(C, C)
            self.ln_2 = nn.LayerNorm(C, eps=1e-5)
            self.c_fc = nn.Linear(C, 4 * C)
            self.mlp_proj = nn.Linear(4 * C, C)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q = q.view(b, t, NH, C // NH).transpose(1, 2)
            k = k.view(b, t, NH, C // NH).transpose(1, 2)
            v = v.view(b, t, NH, C // NH).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            y = y.transpose(1, 2).contiguous().view(b, t, C)
            x = x + self.attn_proj(y)
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT2(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(V, C)
            self.wpe = nn.Embedding(T, C)
            self.h = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C, eps=1e-5)

        def forward(self, idx, targets):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.h:
                x = block(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)  # lm_head tied to wte
            return F.cross_entropy(logits.view(-1, V), targets.view(-1))

    torch.manual_seed(0)
    model = GPT2()
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            torch.nn.init.normal_(p, std=0.02)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=6e-4,
        betas=(0.9, 0.95),
        eps=1e-8,
        fused=True,
    )
    fwd = model if eager else torch.compile(model)
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, V, (B, T), generator=gen)
    tgt = torch.randint(0, V, (B, T), generator=gen)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = fwd(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        return loss

    return step


def timed(step, n):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return times


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    serve = "--serve" in sys.argv
    eager = "--eager" in sys.argv
    threads = int(args[0]) if args else 2
    steps = int(args[1]) if len(args) > 1 else 5
    os.environ["OMP_NUM_THREADS"] = str(threads)
    # Keep stdout for the results: torch and inductor print to both.
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    import torch

    torch.set_num_threads(threads)
    step = build(torch, eager)
    timed(step, 3)  # compile (forward and backward graphs), then warm
    if serve:
        out.write("ready\n")
        for line in sys.stdin:
            n = int(line.strip() or "1")
            out.write("torch_ms=%.1f\n" % (min(timed(step, n)) * 1e3))
        return
    times = timed(step, steps)
    best = min(times)
    out.write(
        "torch_train_step: torch %s%s, %d threads, B=%d T=%d: best %.0f ms (mean %.0f ms over %d), "
        "%.1f GFLOP/s\n"
        % (torch.__version__, " eager" if eager else " compile", threads, B, T, best * 1e3,
           sum(times) / len(times) * 1e3, steps, flops(B, T) / best / 1e9)
    )
    out.write("torch_ms=%.1f\n" % (best * 1e3))


if __name__ == "__main__":
    main()
