"""How long one ray.wait() over N busy streaming generators takes, the driver's fixed cost per wake-up in
`trtc run --ray` (docs/CLUSTER.md). One threaded actor holds N generator tasks that sleep; nothing is ready.

    python examples/ray_wait_cost.py
"""

import json
import time

import ray


def main() -> None:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")

    @ray.remote(num_cpus=0, max_concurrency=1000)
    class Sleeper:
        def gen(self, i):
            time.sleep(60)
            yield i

    a = Sleeper.remote()
    ray.get(a.__ray_ready__.remote())
    out = {}
    for n in (10, 100, 400, 800):
        gens = [a.gen.options(num_returns="streaming").remote(i) for i in range(n)]
        time.sleep(1.0)
        t0 = time.perf_counter()
        for _ in range(50):
            ray.wait(gens, num_returns=1, timeout=0)
        out[n] = round((time.perf_counter() - t0) / 50 * 1e6, 1)
    print(json.dumps({"ray_wait_us_per_call_by_busy_generators": out}))
    ray.shutdown()


if __name__ == "__main__":
    main()
