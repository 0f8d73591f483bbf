"""How distcomm reads each launcher: the same script under torchrun, srun, mpirun and plain python.

Run:  python examples/launch_detection.py

Detection is pure, so we can hand it the environment each launcher would give rank 1 of a job
and print what distcomm concludes, with where every value came from. On a real job, call
``distcomm.detect_environment()`` (or run ``distcomm info --explain``) with no arguments.
"""

from __future__ import annotations

import distcomm

LAUNCHES = {
    "torchrun --nnodes 2 --nproc-per-node 2 (second process)": {
        "RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "0",
        "MASTER_ADDR": "node01",
        "MASTER_PORT": "29500",
    },
    "srun -N 2 -n 5 python train.py (task 3)": {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "1",
        "SLURM_STEP_NUM_TASKS": "5",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_TASKS_PER_NODE": "3,2",
        "SLURM_STEP_NODELIST": "gpu-[07-08]",
    },
    "mpirun -n 2 inside an sbatch script (Hydra proxy started by srun)": {
        "SLURM_JOB_ID": "4243",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_STEP_NUM_TASKS": "1",
        "SLURM_STEP_NODELIST": "cn1",
        "PMI_RANK": "1",
        "PMI_SIZE": "2",
        "MPI_LOCALRANKID": "1",
        "MPI_LOCALNRANKS": "2",
    },
    "python train.py": {},
}


def main() -> None:
    for title, environ in LAUNCHES.items():
        info = distcomm.detect_environment(environ=environ)
        print(
            f"{title}\n  -> {info.method}: rank {info.rank} of {info.world_size}, "
            f"local {info.local_rank} of {info.local_world_size}, node {info.node_rank} of "
            f"{info.num_nodes}, master {info.master_addr}:{info.master_port}"
        )
        print(f"     why: {info.sources['method']}")
        print(
            f"     rank from {info.sources['rank']}, master_port from {info.sources['master_port']}"
        )


if __name__ == "__main__":
    main()
