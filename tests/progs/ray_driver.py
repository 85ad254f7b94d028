"""A Ray driver that knows nothing of mlatrace: two actors call a probed function.

Usage: python ray_driver.py [ADDRESS]   (no address: ray.init() starts a local cluster)
Prints one line per actor: `actor <pid> <ppid> splits <n> user <USER_SETTING in the actor>`.
"""

import os
import sys

import ray


@ray.remote(num_cpus=0)
class Splitter:
    """Each actor is its own worker process, started by the raylet."""

    def split(self, min_kv_seq_len: int) -> tuple[int, int, int, str | None]:
        from mlatrace.reference import policies

        splits = policies.num_kv_splits("legacy", 1, 1, 16, min_kv_seq_len)
        return os.getpid(), os.getppid(), splits, os.environ.get("USER_SETTING")


def main() -> None:
    address = sys.argv[1] if len(sys.argv) > 1 else None
    cluster = {"address": address} if address else {"num_cpus": 1}
    ray.init(**cluster, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"USER_SETTING": "kept"}})
    actors = [Splitter.remote() for _ in range(2)]
    for pid, ppid, splits, user in ray.get([a.split.remote(1 + 4096 * i)
                                            for i, a in enumerate(actors)]):
        print(f"actor {pid} {ppid} splits {splits} user {user}", flush=True)
    ray.shutdown()  # at once: each actor wrote its records at the end of its call


if __name__ == "__main__":
    main()
