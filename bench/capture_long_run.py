#!/usr/bin/env python3
"""One long real training run on a CUDA GPU, recorded into a large memory snapshot.

The speed targets are judged on real traces repeated to 100 MB and more; this writes a large
snapshot that no repetition made: a GPT-style model trained with AdamW (bf16 autocast) and
evaluated every few steps, with Python stacks and `record_function` annotations, for as many
steps as it takes the allocator's ring buffer to hold MAX_ENTRIES events, dumped with
`torch.cuda.memory._dump_snapshot` and gzipped (the dump of a million events is 100-200 MB;
gzip brings it to a tenth).

    python3 bench/capture_long_run.py --out DIR [--entries 1000000] [--seconds 240]

Writes DIR/long_run.pickle.gz and DIR/long_run.json (versions, the run's parameters, entries,
sizes, timings). Needs torch with CUDA; no network, no downloads.
"""
import argparse
import gzip
import json
import os
import platform
import shutil
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--entries", type=int, default=1_000_000, help="ring buffer size (max_entries)")
    ap.add_argument("--seconds", type=float, default=240.0, help="training time limit")
    ap.add_argument("--eval-every", type=int, default=20, help="steps between evaluations")
    args = ap.parse_args()

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    assert torch.cuda.is_available(), "CUDA is not available"
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    dev = torch.device("cuda")

    vocab, d_model, n_layer, n_head, seq = 32000, 512, 8, 8, 256

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(d_model)
            self.qkv = nn.Linear(d_model, 3 * d_model)
            self.proj = nn.Linear(d_model, d_model)
            self.ln2 = nn.LayerNorm(d_model)
            self.fc = nn.Linear(d_model, 4 * d_model)
            self.out = nn.Linear(4 * d_model, d_model)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, n_head, c // n_head).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, d_model)
            self.pos = nn.Embedding(seq, d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(n_layer))
            self.ln = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, vocab, bias=False)

        def forward(self, idx):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x))

    def load_model():
        return GPT().to(dev)

    def train_step(model, opt, batch):
        x, y = batch
        with torch.autocast("cuda", dtype=torch.bfloat16):
            with torch.autograd.profiler.record_function("forward"):
                logits = model(x)
            loss = F.cross_entropy(logits.float().view(-1, vocab), y.view(-1))
        with torch.autograd.profiler.record_function("backward"):
            loss.backward()
        with torch.autograd.profiler.record_function("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        return loss

    @torch.no_grad()
    def evaluate(model, batch):
        x, y = batch
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
        return F.cross_entropy(logits.float().view(-1, vocab), y.view(-1))

    def get_batch(size):
        x = torch.randint(0, vocab, (size, seq), device=dev)
        return x, torch.roll(x, -1, dims=1)

    started = time.time()
    torch.cuda.memory._record_memory_history(
        enabled="all", context="all", stacks="python", max_entries=args.entries
    )
    model = load_model()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    steps = evals = 0
    # Batches vary a little, as a data loader's last batches and packed sequences do.
    sizes = [8, 8, 12, 8, 6, 8, 16, 8]
    while time.time() - started < args.seconds:
        train_step(model, opt, get_batch(sizes[steps % len(sizes)]))
        steps += 1
        if steps % args.eval_every == 0:
            evaluate(model, get_batch(32))
            evals += 1
        if steps % 50 == 0:
            torch.cuda.synchronize()
            print(f"step {steps}, {time.time() - started:.0f}s", flush=True)
    torch.cuda.synchronize()
    trained = time.time() - started
    raw = os.path.join("/tmp", "long_run.pickle")
    t = time.time()
    torch.cuda.memory._dump_snapshot(raw)
    dumped = time.time() - t
    torch.cuda.memory._record_memory_history(enabled=None)
    snapshot_bytes = os.path.getsize(raw)
    t = time.time()
    gz = os.path.join(args.out, "long_run.pickle.gz")
    with open(raw, "rb") as src, open(gz, "wb") as f:
        with gzip.GzipFile(fileobj=f, mode="wb", compresslevel=6, mtime=0) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    zipped = time.time() - t
    # Entries as torch recorded them (pickle.load of the dump: trusted, it is this run's own).
    import pickle

    t = time.time()
    with open(raw, "rb") as f:
        snap = pickle.load(f)
    load_s = time.time() - t
    entries = sum(len(tr) for tr in snap["device_traces"])
    info = {
        "command": " ".join(["python3", "bench/capture_long_run.py"] + sys.argv[1:]),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0),
        "model": {"vocab": vocab, "d_model": d_model, "n_layer": n_layer, "n_head": n_head,
                  "seq": seq, "params": sum(p.numel() for p in model.parameters())},
        "batch_sizes": sizes,
        "eval_every": args.eval_every,
        "max_entries": args.entries,
        "steps": steps,
        "evals": evals,
        "trace_entries": entries,
        "segments": len(snap["segments"]),
        "snapshot_bytes": snapshot_bytes,
        "gzip_bytes": os.path.getsize(gz),
        "seconds": {"train": round(trained, 1), "dump": round(dumped, 1),
                    "gzip": round(zipped, 1), "pickle_load_here": round(load_s, 2)},
    }
    with open(os.path.join(args.out, "long_run.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
