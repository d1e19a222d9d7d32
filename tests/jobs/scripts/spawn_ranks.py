"""Start N ranks of a script as plain processes (no torchrun agent) and wait for all of them.

torchrun tears a job down as soon as one rank fails, by design; this launcher does not, so a test
can kill one rank and watch what the others do. Rendezvous is torch's `env://` (rank 0 hosts the
store). Exit status: the highest of the ranks' (a killed rank counts as 0: it was meant to die).

    python spawn_ranks.py NPROC script.py [args...]
"""

import os
import socket
import subprocess
import sys


def main(argv):
    nproc, script = int(argv[0]), argv[1:]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    procs = []
    for rank in range(nproc):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(nproc),
            LOCAL_WORLD_SIZE=str(nproc),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
        )
        procs.append(subprocess.Popen([sys.executable, *script], env=env))
    return max(max(p.wait(), 0) for p in procs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
