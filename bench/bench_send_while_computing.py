"""How long a Gloo p2p message takes to arrive when its sender goes on computing (not a timed
test). README "Calibrate and validate" explains why this matters: torch's ScheduleGPipe posts
every send and computes on without waiting for it, Schedule1F1B waits on its sends (fused with
the next receive); on a host whose cores are all busy, the sender's Gloo transport thread must
wait for a core before the data leaves.

    python bench/bench_send_while_computing.py [--repeats 40] [--compute-ms 8]

Runs itself under torchrun with 2 local processes, one intra-op thread each. Rank 0 sends one
float32 tensor to rank 1 per repeat, in four ways, interleaved (one of each in turn):

  recv first, sender waits     rank 1 has posted its receive; rank 0 isends and waits for it
  recv first, sender computes  the same, but rank 0 runs `--compute-ms` of matmuls after isend
  recv late, sender waits      rank 1 posts its receive 4 ms after rank 0's isend
  recv late, sender computes   both

and prints, per message size, the median time from the send (receive posted first) or from the
receive's posting (receive late) to rank 1 holding the data.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist

SIZES = (4096, 65536, 262144, 655360, 2621440)
MODES = ("recv first, sender waits", "recv first, sender computes", "recv late, sender waits",
         "recv late, sender computes")
kEarlyS = 0.003  # the receive is posted this long before the send
kLateS = 0.004   # ...or this long after it


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--compute-ms", type=float, default=8.0)
    args = p.parse_args()
    if "RANK" not in os.environ:  # relaunch under torchrun with 2 local ranks
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        return subprocess.call([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                "--nproc-per-node", "2", os.path.abspath(__file__),
                                *sys.argv[1:]], env=env)
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
        times = {m: [] for m in MODES}
        for _ in range(warmup + args.repeats):
            for mode in MODES:
                recv_late, sender_computes = mode.startswith("recv late"), mode.endswith("computes")
                dist.barrier()
                if rank == 0:
                    if not recv_late:
                        time.sleep(kEarlyS)
                    work = dist.isend(x, 1)
                    if sender_computes:
                        compute(args.compute_ms / 1e3)
                    else:
                        time.sleep(args.compute_ms / 1e3)
                    work.wait()
                else:
                    if recv_late:
                        time.sleep(kLateS)
                    start = time.perf_counter()
                    dist.irecv(x, 0).wait()
                    times[mode].append(time.perf_counter() - start - (0 if recv_late else kEarlyS))
        if rank == 1:
            cells = ", ".join(f"{m}: {statistics.median(v[warmup:]) * 1e3:.2f} ms"
                              for m, v in times.items())
            print(f"{nbytes:>8d} B  {cells}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
