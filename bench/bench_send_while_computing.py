"""How long a Gloo p2p message takes to arrive when its sender goes on computing (not a timed
test). docs/calibration.md explains why this matters: torch's ScheduleGPipe posts
every send and computes on without waiting for it, Schedule1F1B waits on its sends (fused with
the next receive). With the receive posted first, Gloo's isend writes the message on the
caller's thread; what this VM then delays (1-2 ms) is the receiver's wake-up while the sender
computes, when the sender was idle just before its send.

    python bench/bench_send_while_computing.py [--repeats 40] [--compute-ms 8]

Runs itself under torchrun with 2 local processes, one intra-op thread each. Rank 0 sends one
float32 tensor to rank 1 per repeat, in five ways, interleaved (one of each in turn):

  recv first, sender waits     rank 1 has posted its receive; rank 0 isends and waits for it
  recv first, sender computes  the same, but rank 0 runs `--compute-ms` of matmuls after isend
  recv late, sender waits      rank 1 posts its receive 4 ms after rank 0's isend
  recv late, sender computes   both
  recv first, sender busy      like "recv first, sender computes", but rank 0 computes through
                               the 3 ms before its isend instead of sleeping: whether the delay
                               comes from computing after the send or from a sender that was
                               idle (its core halted) just before it

and prints, per message size, the median time from the moment both sides were ready (the later
of rank 0's isend and rank 1's receive posting, on the host's one monotonic clock) to rank 1
holding the data; and how long the isend call itself takes when the receive is already posted
(Gloo then writes the message on the caller's thread).
"""

import argparse
import statistics
import sys
import time

from torchrun_relaunch import relaunch  # this folder

import torch
import torch.distributed as dist

SIZES = (4096, 65536, 262144, 655360, 2621440)
MODES = ("recv first, sender waits", "recv first, sender computes", "recv late, sender waits",
         "recv late, sender computes", "recv first, sender busy")
kEarlyS = 0.003  # the receive is posted this long before the send
kLateS = 0.004   # ...or this long after it


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--compute-ms", type=float, default=8.0)
    args = p.parse_args()
    code = relaunch(__file__, sys.argv[1:])  # under torchrun with 2 local ranks
    if code is not None:
        return code
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    a = torch.randn(256, 256)

    def compute(seconds: float) -> None:
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            a @ a

    warmup = 3
    for nbytes in SIZES:
        x = torch.zeros(nbytes // 4)
        stamps = []  # rank 0: (mode, isend start, isend end); rank 1: (mode, recv posted, data in)
        for repeat in range(warmup + args.repeats):
            for mode in MODES:
                recv_late = mode.startswith("recv late")
                sender_computes = mode.endswith(("computes", "busy"))
                dist.barrier()
                if rank == 0:
                    if mode.endswith("busy"):
                        compute(kEarlyS)
                    elif not recv_late:
                        time.sleep(kEarlyS)
                    sent = time.perf_counter()
                    work = dist.isend(x, 1)
                    returned = time.perf_counter()
                    if sender_computes:
                        compute(args.compute_ms / 1e3)
                    else:
                        time.sleep(args.compute_ms / 1e3)
                    work.wait()
                    stamps.append((mode, sent, returned))
                else:
                    if recv_late:
                        time.sleep(kLateS)
                    posted = time.perf_counter()
                    dist.irecv(x, 0).wait()
                    stamps.append((mode, posted, time.perf_counter()))
        # Both ranks read the host's one monotonic clock: a message arrives `in - max(sent,
        # posted)` after both sides were ready.
        both = [None, None]
        dist.all_gather_object(both, stamps)
        if rank == 0:
            delivery = {m: [] for m in MODES}
            in_isend = []
            for i, ((mode, sent, returned), (_, posted, arrived)) in enumerate(zip(*both)):
                if i < warmup * len(MODES):
                    continue
                delivery[mode].append(arrived - max(sent, posted))
                if mode == "recv first, sender waits":
                    in_isend.append(returned - sent)
            cells = ", ".join(f"{m}: {statistics.median(v) * 1e3:.2f} ms"
                              for m, v in delivery.items())
            print(f"{nbytes:>8d} B  isend returns after {statistics.median(in_isend) * 1e3:.2f} ms"
                  f" (receiver ready); delivered: {cells}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
