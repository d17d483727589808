"""One worker of the collectives benchmark with torch.distributed's Gloo backend: the same loop as
bench/collectives-worker.js. Started with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set; argv[1]
is the JSON spec {sizes, warmup, budgetBytes, minIterations}; rank 0 prints {sizes: [{op, bytes, ms}]}.
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    spec = json.loads(sys.argv[1])
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    results = []
    for op in ("allreduce", "allgather"):
        for nbytes in spec["sizes"]:
            count = nbytes // 4 if op == "allreduce" else nbytes // 4 // world
            data = torch.full((count,), float(rank + 1))
            outputs = [torch.empty(count) for _ in range(world)]

            def run():
                if op == "allreduce":
                    dist.all_reduce(data)
                else:
                    dist.all_gather(outputs, data)

            n = min(spec["maxIterations"], max(spec["minIterations"], round(spec["budgetBytes"] / nbytes)))
            for _ in range(spec["warmup"]):
                run()
            times = []
            for _ in range(n):
                dist.barrier()
                t = time.perf_counter()
                run()
                times.append((time.perf_counter() - t) * 1000)
            # The slowest rank decides how long a collective took.
            gathered = [torch.empty(n, dtype=torch.float64) for _ in range(world)]
            dist.all_gather(gathered, torch.tensor(times, dtype=torch.float64))
            worst = sorted(max(g[i].item() for g in gathered) for i in range(n))
            results.append({"op": op, "bytes": nbytes, "ms": worst[n // 2]})
    if rank == 0:
        print(json.dumps({"sizes": results}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
