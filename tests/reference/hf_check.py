#!/usr/bin/env python3
"""Independent check of `zshard train` against Hugging Face transformers and PyTorch.

Trains the same model on the same chunks with GPT2LMHeadModel in float64 and
torch.optim.AdamW, starting from zshard's initial weights, and compares each step's loss and
gradient norm with zshard's metrics.jsonl, and the final weights with zshard's
model.safetensors.  It also loads zshard's output with from_pretrained, which checks the
model directory format, and does the same with a distributed run's final checkpoint exported
by `zshard export`, whose weights must equal zshard train's bit for bit.

usage: hf_check.py ZSHARD CONFIG DATA WORKDIR [STEPS]
Exit status: 0 agreement, 1 disagreement, 77 (skip) when torch or transformers is missing.
"""
import json
import math
import os
import subprocess
import sys

try:
    import torch
    from safetensors.torch import load_file
    from transformers import GPT2Config, GPT2LMHeadModel
except ImportError as e:  # the suite runs without them; CTest reports a skip
    print(f"hf_check: skipped: {e}")
    sys.exit(77)

M64 = (1 << 64) - 1
DATA_SALT = 0x646174612D736571


def mix(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def rng_u64(seed, stream, index):
    return mix(mix(mix(seed) ^ stream) ^ index)


def chunk(tokens, seed, step, c, b, t):
    """common/data.c's zs_data_chunk, reimplemented."""
    starts = len(tokens) - t
    xs, ys = [], []
    for j in range(b):
        s = rng_u64(seed ^ DATA_SALT, step, (c << 32) | j) % starts
        xs.append(tokens[s:s + t])
        ys.append(tokens[s + 1:s + t + 1])
    return torch.tensor(xs), torch.tensor(ys)


def main():
    zshard, cfg_path, data, work = sys.argv[1:5]
    steps = int(sys.argv[5]) if len(sys.argv) > 5 else 3
    cfg = json.load(open(cfg_path))
    m = cfg["model"]
    opt = cfg.get("optimizer", {}).get("params", {})
    if "scheduler" in cfg:
        sys.exit("hf_check: configs with a scheduler are not supported by this check")
    seed = cfg.get("seed", 42)
    b = cfg["train_micro_batch_size_per_gpu"]
    C = cfg["train_batch_size"] // b
    T = m["block_size"]
    clip = cfg.get("gradient_clipping", 1.0)
    tokens = list(open(data, "rb").read())

    os.makedirs(work, exist_ok=True)
    init_dir, out_dir = os.path.join(work, "init"), os.path.join(work, "out")
    run = lambda steps_, out: subprocess.run(
        [zshard, "train", "--config", cfg_path, "--data", data, "--steps", str(steps_),
         "--out", out, "--log-level", "warn"], check=True)
    run(0, init_dir)
    run(steps, out_dir)

    model = GPT2LMHeadModel.from_pretrained(init_dir).double()
    model.eval()  # no dropout (all p are 0 anyway)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optim = torch.optim.AdamW(
        [{"params": decay, "weight_decay": opt.get("weight_decay", 0.01)},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=opt.get("lr", 3e-4), betas=tuple(opt.get("betas", (0.9, 0.999))),
        eps=opt.get("eps", 1e-8))
    metrics = [json.loads(l) for l in open(os.path.join(out_dir, "metrics.jsonl"))]
    worst_loss = worst_norm = 0.0
    for s in range(steps):
        optim.zero_grad()
        total = 0.0
        for c in range(C):
            x, y = chunk(tokens, seed, s, c, b, T)
            logits = model(x).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                                     y.reshape(-1))
            loss.backward()
            total += loss.item()
        for p in model.parameters():
            p.grad /= C
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(),
                                              clip if clip > 0 else float("inf")).item()
        optim.step()
        zl, zn = metrics[s]["loss"], metrics[s]["grad_norm"]
        worst_loss = max(worst_loss, abs(zl - total / C) / (total / C))
        worst_norm = max(worst_norm, abs(zn - norm) / norm)
        print(f"step {s + 1}: loss zshard {zl:.7f} hf {total / C:.7f} | "
              f"grad_norm zshard {zn:.7f} hf {norm:.7f}")

    ours = load_file(os.path.join(out_dir, "model.safetensors"))
    worst_w, worst_name = 0.0, ""
    sd = model.state_dict()
    for name, w in ours.items():
        diff = (w.double() - sd[name]).abs().max().item()
        if diff > worst_w:
            worst_w, worst_name = diff, name
    # Tolerances: fp32 against fp64 over a few steps.  Losses and norms agree to ~1e-6
    # relative when the kernels are right; a wrong kernel is off by far more.  Adam normalizes
    # each update to about lr per step, so a weight can differ by at most ~2 * lr * steps, and
    # does so only where a gradient's sign flips under rounding; we allow 5% of that bound.
    lr = opt.get("lr", 3e-4)
    w_tol = 0.05 * 2 * lr * steps
    print(f"worst relative loss diff {worst_loss:.2e}, grad_norm diff {worst_norm:.2e}, "
          f"weight diff {worst_w:.2e} ({worst_name}; tolerance {w_tol:.1e})")
    ok = worst_loss < 1e-5 and worst_norm < 1e-4 and worst_w < w_tol

    # A distributed run's final checkpoint, exported by `zshard export`, loads with
    # from_pretrained and holds exactly zshard train's final weights.
    launch_dir, export_dir = os.path.join(work, "launch"), os.path.join(work, "export")
    subprocess.run([zshard, "launch", "--config", cfg_path, "--data", data, "--steps",
                    str(steps), "--servers", "2", "--workers", "1", "--out", launch_dir,
                    "--log-level", "warn"], check=True)
    subprocess.run([zshard, "export", os.path.join(launch_dir, "checkpoints"), "--out",
                    export_dir], check=True)
    exported = GPT2LMHeadModel.from_pretrained(export_dir)
    esd = exported.state_dict()
    same = all(torch.equal(w, esd[name]) for name, w in ours.items())
    print("export: from_pretrained loads it; weights " +
          ("equal zshard train's" if same else "DIFFER from zshard train's"))
    ok = ok and same
    print("hf_check: " + ("agree" if ok else "DISAGREE"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
