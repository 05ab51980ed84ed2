import datetime, os, socket, sys
import torch, torch.distributed as dist, torch.multiprocessing as mp
import braid_torch

def body(rank, world, port):
    dist.init_process_group("braid", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))
    t = torch.arange(7, dtype=torch.float32) + rank
    dist.all_reduce(t)
    want = torch.arange(7, dtype=torch.float32) * world + world * (world - 1) / 2
    if not torch.equal(t, want):
        raise SystemExit(f"rank {rank}: {t}")
    dist.destroy_process_group()

if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    mp.spawn(body, args=(2, port), nprocs=2, join=True)
    print("braid_torch from", os.path.dirname(braid_torch.__file__), "- all_reduce on 2 ranks exact")
