"""adamw_peers: time other AdamW implementations on the CPU, for bench_adamw.

The peers:
  torch_fused    torch.optim.AdamW(fused=True): PyTorch's fused CPU kernel
  torch_foreach  torch.optim.AdamW(foreach=True): for information, the multi-tensor path
  deepspeed      deepspeed.ops.adam.DeepSpeedCPUAdam(adamw_mode=True)

Each does AdamW on one flat fp32 tensor of `params` elements with the hyperparameters of
bench_adamw (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01): reads p, g, m, v and
writes p, m, v, 28 bytes per parameter.  The peers share p and g; each has its own m and v.
A peer that cannot be set up (not installed, DeepSpeed's C++ op fails to build) is skipped
with the reason, never failed.

Two modes:
  python adamw_peers.py PARAMS THREADS REPEATS
      times each peer on its own, best of REPEATS after a warm-up step, and prints one line
      per peer:  peer=NAME params_per_s=X best_ms=Y   or   peer=NAME skipped=REASON
  python adamw_peers.py --serve PARAMS THREADS
      for bench_adamw, which interleaves the peers with its own runs: prints
      peer=NAME ready  or  peer=NAME skipped=REASON  per peer, then  ready;  then for each
      line NAME read from stdin runs one step of that peer and prints  NAME SECONDS.
      Everything else the libraries print (DeepSpeed's logs, the op's build) goes to stderr,
      so that stdout carries only this protocol.

THREADS is applied before torch is imported (OMP_NUM_THREADS, which DeepSpeed's OpenMP loop
reads) and with torch.set_num_threads (which PyTorch's kernels use).
"""

import os
import sys
import time


def make_peers(n, threads, log):
    """(name, step function) per usable peer; logs a skip line for the others."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        import torch
    except Exception as e:  # not installed, or broken: every peer needs it
        for name in ("torch_fused", "torch_foreach", "deepspeed"):
            log("peer=%s skipped=%s" % (name, reason(e)))
        return []
    torch.set_num_threads(threads)
    i = torch.arange(n, dtype=torch.int64)
    p = torch.nn.Parameter((i % 100).to(torch.float32) * 0.01)
    p.grad = (i % 37).to(torch.float32) * 0.001 - 0.018
    del i
    hyper = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    peers = []
    for name, kw in (("torch_fused", dict(fused=True)), ("torch_foreach", dict(foreach=True))):
        try:
            opt = torch.optim.AdamW([p], **hyper, **kw)
            opt.step()  # allocates m and v, so that the timed steps do not
            peers.append((name, opt.step))
        except Exception as e:
            log("peer=%s skipped=%s" % (name, reason(e)))
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        # The first construction compiles the C++ op (minutes) and caches it.
        opt = DeepSpeedCPUAdam([p], **hyper, adamw_mode=True)
        opt.step()
        peers.append(("deepspeed", opt.step))
    except BaseException as e:  # a failed build may raise SystemExit from the build tools
        if isinstance(e, KeyboardInterrupt):
            raise
        log("peer=deepspeed skipped=%s" % reason(e))
    for name, _ in peers:
        log("peer=%s ready" % name)
    return peers


def reason(e):
    """An exception as one line: its type and the last line of its message."""
    lines = [line for line in str(e).strip().splitlines() if line.strip()]
    return "%s: %s" % (type(e).__name__, lines[-1] if lines else "")


def timed(step):
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


def standalone(n, threads, repeats):
    peers = make_peers(n, threads, lambda line: print(line, flush=True))
    for name, step in peers:
        best = min(timed(step) for _ in range(repeats))
        print("peer=%s params_per_s=%.3g best_ms=%.2f threads=%d params=%d repeats=%d"
              % (name, n / best, best * 1e3, threads, n, repeats), flush=True)


def serve(n, threads):
    # The protocol keeps the real stdout; fd 1 becomes stderr for everything else, including
    # output of child processes (ninja, the compiler) and of C++ code.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def say(line):
        proto.write(line + "\n")

    steps = dict(make_peers(n, threads, say))
    say("ready")
    for line in sys.stdin:
        name = line.strip()
        if name in steps:
            say("%s %.9f" % (name, timed(steps[name])))
        else:
            say("%s unknown" % name)


def main(argv):
    try:
        if len(argv) == 4 and argv[1] == "--serve":
            return serve(int(argv[2]), int(argv[3]))
        if len(argv) == 4:
            return standalone(int(argv[1]), int(argv[2]), int(argv[3]))
    except ValueError:
        pass
    print("usage: adamw_peers.py PARAMS THREADS REPEATS | --serve PARAMS THREADS", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
