"""A small GPT-2 (built from a config: no weights downloaded) trained under the plan hybridplan
chooses for this job:  torchrun --nproc-per-node 2 examples/train_parallelize.py [STEPS]
(or python -m hybridplan run --nproc-per-node 2 examples/train_parallelize.py [STEPS])."""
import sys

import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel

import hybridplan


def build_model():  # no dropout, so that any plan trains as one process does
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128,
                                      n_positions=32, bos_token_id=0, eos_token_id=0,
                                      use_cache=False, resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0))


def batch(n, step):  # n counting sequences (each token is the previous + 1): inputs, targets
    ids = (torch.randint(0, 128, (n, 1), generator=torch.Generator().manual_seed(step))
           + torch.arange(33)) % 128
    return {"input_ids": ids[:, :-1]}, ids[:, 1:]


def loss_fn(output, target):  # next-token cross-entropy from the ModelOutput's logits
    return F.cross_entropy(output.logits.flatten(0, 1), target.flatten())


if __name__ == "__main__":
    inputs, target = batch(8, 0)  # one replica's batch: what the profile measures
    hp = hybridplan.parallelize(build_model(), inputs, example_target=target, loss_fn=loss_fn,
                                optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3))
    global_batch = hp.plan.dp * hp.plan.per_replica_batch  # every rank draws the same batch
    for step in range(int(sys.argv[1]) if len(sys.argv) > 1 else 20):
        loss = hp.step(*hp.shard(*batch(global_batch, step)))  # and trains on its share
        if hp.rank == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)
    hp.close()
