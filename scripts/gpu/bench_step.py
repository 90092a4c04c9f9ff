"""Median training-step time of a small transformer, for the overhead check of scripts/gpu-check.sh.

A 6-layer transformer encoder (d_model 512, 8 heads, FFN 2048, vocabulary 8192, about 27 M
parameters) trained with AdamW under bf16 autocast, batch 32 x 256 tokens. Warm-up steps are
not timed; every timed step ends with torch.cuda.synchronize(). Prints one JSON line and, with
--json-out, writes it to a file.

    python3 bench_step.py --mode untraced --json-out r.json
    python3 bench_step.py --mode history --record-history --json-out r.json
        # torch.cuda.memory._record_memory_history(max_entries=100000) on before the model exists

The wrapper (LD_PRELOAD, oomtrace run --torch) is the caller's business; --mode is only a label.
"""

import argparse
import json
import statistics
import sys
import time

try:
    import torch
    import torch.nn as nn
except ImportError:
    print("bench_step.py: PyTorch is not installed", file=sys.stderr)
    sys.exit(2)


class TinyLM(nn.Module):
    def __init__(self, vocab, d_model, heads, ffn, layers, seq):
        super().__init__()
        self.emb = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(1, seq, d_model))
        layer = nn.TransformerEncoderLayer(d_model, heads, ffn, dropout=0.1,
                                           batch_first=True, norm_first=True)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens):
        h = self.emb(tokens) + self.pos[:, : tokens.shape[1]]
        return self.head(self.norm(self.body(h)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="untraced", help="label written to the result")
    ap.add_argument("--record-history", action="store_true",
                    help="torch.cuda.memory._record_memory_history(max_entries=100000)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--json-out")
    ap.add_argument("--device", default="cuda", help="cpu: try the script without a GPU")
    args = ap.parse_args()
    if args.steps < 100:
        ap.error("--steps must be at least 100")

    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("bench_step.py: torch.cuda.is_available() is False", file=sys.stderr)
        sys.exit(2)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    if args.record_history:
        torch.cuda.memory._record_memory_history(max_entries=100000)

    torch.manual_seed(0)
    vocab = 8192
    model = TinyLM(vocab, 512, 8, 2048, 6, args.seq).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        tokens = torch.randint(0, vocab, (args.batch, args.seq), device=dev)
        target = torch.randint(0, vocab, (args.batch, args.seq), device=dev)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            logits = model(tokens)
            loss = loss_fn(logits.float().view(-1, vocab), target.view(-1))
        loss.backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    sync()
    times = []
    for _ in range(args.steps):
        t = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t)

    if args.record_history:
        torch.cuda.memory._record_memory_history(enabled=None)
    times.sort()
    result = {
        "mode": args.mode,
        "steps": len(times),
        "warmup": args.warmup,
        "median_ms": statistics.median(times) * 1e3,
        "p10_ms": times[len(times) // 10] * 1e3,
        "p90_ms": times[(len(times) * 9) // 10] * 1e3,
        "params": sum(p.numel() for p in model.parameters()),
    }
    line = json.dumps(result)
    print(line, flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
