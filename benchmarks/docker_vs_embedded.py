"""A docker-mode run beside an embedded run of the same model and grid: wall time, stage by stage.

Both run `tbench run` (the CLI, as a user does) on the small ResNet-50 with the same grid, alternating
embedded, docker, embedded, docker ... `--repeats` times. docker mode serves with a Triton image built from this
machine's files (infra/build_cpu_image.py: the same tritonserver binary and python backend as embedded), so the
difference is docker's: the container's start (a vfs copy of the image here), the `docker run` client, and the image's
backend listing. A Docker daemon must be reachable, or startable as root (tests/services.py). Writes
benchmarks/results/docker_vs_embedded.json, whole, with its provenance.

Usage: .venv/bin/python benchmarks/docker_vs_embedded.py [--size small] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import RESULTS, recorded

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from services import cpu_image, docker_daemon  # noqa: E402  (the tests' way of reaching Docker)

TBENCH = str(Path(sys.executable).with_name("tbench"))
GRID = [
    "resnet50",
    "--formats",
    "onnx",
    "--scenarios",
    "offline,online",
    "--batch-sizes",
    "1,2,4,8",
    "--concurrency",
    "1,2,4",
    "--window-s",
    "0.5",
]
# this sandbox's daemon cannot raise memlock past the host's limit; no GPUs here
DOCKER = ["--server", "docker", "--gpus", "none", "--docker-ulimit", "none"]


def one_run(size: str, extra: list[str], output: Path) -> dict:
    started = time.monotonic()
    done = subprocess.run(
        [TBENCH, "run", *GRID, "--size", size, *extra, "--output", str(output)], capture_output=True, text=True
    )
    wall = time.monotonic() - started
    run_dir = Path(done.stdout.strip().splitlines()[-1])
    if done.returncode != 0:
        raise SystemExit(f"tbench run {' '.join(extra)} failed ({done.returncode}): {done.stdout[-2000:]}")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    stages = {name: round(stage["seconds"], 2) for name, stage in manifest["stages"].items()}
    return {"wall_s": round(wall, 1), "stages_s": stages, "points": manifest["points"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--size", default="small", help="the ResNet-50 size both modes serve")
    args = parser.parse_args()
    with (
        recorded(RESULTS / "docker_vs_embedded.json", model_sizes=[f"resnet50 {args.size}"]) as record,
        docker_daemon() as env,
    ):
        os.environ.update(env)
        image = cpu_image(env)
        output = Path(tempfile.mkdtemp(prefix="tbench-docker-bench-"))
        runs = {"embedded": [], "docker": []}
        for i in range(args.repeats):
            for mode, extra in (("embedded", []), ("docker", [*DOCKER, "--docker-image", image])):
                runs[mode].append(one_run(args.size, extra, output))
                print(f"{mode} #{i + 1}: {runs[mode][-1]['wall_s']} s", flush=True)
        median = {mode: statistics.median(r["wall_s"] for r in rs) for mode, rs in runs.items()}
        record.update(
            {
                "grid": [*GRID, "--size", args.size],
                "docker_args": DOCKER,
                "image": image,
                "runs": runs,
                "wall_median_s": median,
                "ratio_docker_to_embedded": round(median["docker"] / median["embedded"], 2),
            }
        )
        print(
            f"median wall: embedded {median['embedded']} s, docker {median['docker']} s, "
            f"ratio {median['docker'] / median['embedded']:.2f}"
        )


if __name__ == "__main__":
    main()
