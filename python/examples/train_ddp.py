"""Data-parallel training with torch.distributed on Braid: the reference for users.

Every rank trains a copy of a small classifier on its share of a synthetic data set; DDP averages
the gradients through the chosen backend after each backward pass. Switching from gloo (or nccl)
to Braid is one import and one word.

Run it under any launcher (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment):
    braid run -n 2 /usr/bin/python3 python/examples/train_ddp.py
    torchrun --standalone --nproc_per_node 2 --redirects 1 --tee 1 python/examples/train_ddp.py
or let it start its ranks itself (torch.multiprocessing.spawn, on a free port):
    /usr/bin/python3 python/examples/train_ddp.py --nprocs 2
Options: --backend braid|gloo, --epochs, --accumulate (steps per optimizer step, with no_sync),
--bucket-cap-mb, --checkpoint PATH.
"""
import argparse
import os
import socket
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import braid_torch  # noqa: F401  registers the backend "braid"


def make_data(n, seed):
    """Points around 4 fixed centres in 8 dimensions, labelled by centre; `seed` draws the points."""
    centres = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)) * 3
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (n,), generator=g)
    return TensorDataset(centres[labels] + torch.randn(n, 8, generator=g), labels)


def train(rank, world, args):
    dist.init_process_group(args.backend)  # env:// from the launcher, or set by main() for spawn
    torch.manual_seed(0)  # the same initial model everywhere (DDP also broadcasts rank 0's)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)),
                bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train_set, test_set = make_data(2048, seed=1), make_data(512, seed=2)
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=7)
    loader = DataLoader(train_set, batch_size=32, sampler=sampler)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a different shuffle every epoch, the same on every rank
        for i, (x, y) in enumerate(loader):
            loss = torch.nn.functional.cross_entropy(model(x), y) / args.accumulate
            if (i + 1) % args.accumulate:
                with model.no_sync():  # accumulate locally; no communication this step
                    loss.backward()
                continue
            loss.backward()  # gradients are averaged across ranks here
            opt.step()
            opt.zero_grad()
        accuracy = evaluate(model.module, test_set, rank, world)
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item() * args.accumulate:.4f}, test accuracy {accuracy:.3f}", flush=True)
    # Checkpoint: rank 0 saves model.module (the plain model), every rank loads it back into a
    # fresh model. What each rank loaded must equal what it trained (DDP keeps the replicas equal)
    # and what rank 0 saved (rank 0's parameters, broadcast): a rank that read another file, a
    # stale one or a partial one, differs from both.
    trained = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
    if rank == 0:
        torch.save(trained, args.checkpoint)
    dist.barrier()  # the file is complete before anyone reads it
    fresh = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    fresh.load_state_dict(torch.load(args.checkpoint))
    loaded = torch.cat([v.flatten() for v in fresh.state_dict().values()])
    saved = torch.cat([v.flatten() for v in trained.values()])
    dist.broadcast(saved, src=0)  # rank 0's parameters, as it saved them
    same = torch.equal(loaded, saved) and torch.equal(loaded, torch.cat([v.flatten() for v in trained.values()]))
    agree = torch.tensor([1 if same else 0])
    dist.all_reduce(agree)  # how many ranks loaded exactly what rank 0 saved
    if rank == 0:
        print(f"checkpoint saved by rank 0 and loaded on {world} ranks: {agree.item()} of {world} loaded "
              f"{'exactly what was saved' if agree.item() == world else 'something else'}", flush=True)
    same = agree.item() == world
    dist.destroy_process_group()
    if not same or accuracy < 0.9:
        raise SystemExit(f"rank {rank}: checkpoint {'ok' if same else 'differs'}, accuracy {accuracy:.3f}")


def evaluate(model, dataset, rank, world):
    """Each rank scores its own shard; all_gather brings the counts together."""
    x, y = dataset.tensors
    mine = slice(rank, None, world)
    with torch.no_grad():
        correct = (model(x[mine]).argmax(1) == y[mine]).sum()
    counts = [torch.zeros_like(correct) for _ in range(world)]
    dist.all_gather(counts, correct)
    return float(sum(c.item() for c in counts)) / len(y)


def spawned(rank, world, port, args):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    train(rank, world, args)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="braid", choices=["braid", "gloo"])
    p.add_argument("--nprocs", type=int, default=0, help="start this many ranks with mp.spawn (no launcher)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--accumulate", type=int, default=2)
    p.add_argument("--bucket-cap-mb", type=float, default=25)
    p.add_argument("--checkpoint", default=os.path.join(tempfile.gettempdir(), f"train_ddp-{os.getuid()}.pt"))
    args = p.parse_args()
    if "RANK" in os.environ:  # under braid run, torchrun, mpirun with MASTER_ADDR...
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
    else:
        with socket.socket() as s:  # a free port for the rendezvous
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        world = args.nprocs or 2
        mp.spawn(spawned, args=(world, port, args), nprocs=world)


if __name__ == "__main__":
    main()
