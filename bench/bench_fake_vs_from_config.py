"""The fake profile of a Hugging Face GPT-2 block beside graph-from-config's graph of the same
configuration, node by node (docs/fake_profile.md "Against graph-from-config").

    python bench/bench_fake_vs_from_config.py [--dropout 0.0] [--activation gelu_pytorch_tanh]
                                              [--hidden 4096 --heads 32 --seq 2048]

Prints each graph's nodes with forward and backward milliseconds, both priced for H100 (the
fake profile by the device model, from_config by its GEMM model; both use gemm_time).
`tests/python/test_fake_profile.py::test_gpt_nodes_agree_with_graph_from_config` holds the
nodes and spans the two cut alike within 5 % at the defaults.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python")]

import torch  # noqa: E402

from hybridplan.profiler import profile_dict  # noqa: E402
from hybridplan.profiler.from_config import TransformerConfig, graph_from_config  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--activation", default="gelu_pytorch_tanh")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=50304)
    args = parser.parse_args()
    import transformers
    config = transformers.GPT2Config(n_embd=args.hidden, n_head=args.heads, n_layer=1,
                                     n_positions=args.seq, vocab_size=args.vocab,
                                     attn_pdrop=args.dropout, resid_pdrop=args.dropout,
                                     embd_pdrop=args.dropout,
                                     activation_function=args.activation)
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(config).to(torch.bfloat16)
    fake = profile_dict(model, torch.zeros(1, args.seq, dtype=torch.long), device_model="H100",
                        verbose=False, batch_sizes=())
    planned = graph_from_config(TransformerConfig("gpt", layers=1, hidden=args.hidden,
                                                  heads=args.heads, seq_len=args.seq,
                                                  vocab=args.vocab), device="H100",
                                batch_multiples=())
    for title, graph in (("fake profile (Hugging Face GPT-2)", fake),
                         ("graph-from-config", planned)):
        print(f"\n{title}\n\n| node | forward ms | backward ms |\n|---|---|---|")
        for n in graph["nodes"]:
            print(f"| {n['name']} | {n['forward_s'] * 1e3:.3f} | {n['backward_s'] * 1e3:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
