"""The offline GPU kit built from an empty cache, timed, and checked by its tests (tests/test_gpu_kit.py), which the
default suite runs only on a kit already built: the kit's full build is this command of its own.

Writes benchmarks/results/gpu_kit_build.json with its provenance (benchmarks/provenance.py): the build's seconds (pip's
own cache may be warm, as on a developer's machine), each part's size against the transfer limit, and the tests'
outcome on the kit just built.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import RESULTS, recorded

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep-cache", action="store_true", help="build into ~/.cache/tbench/gpu_kit (warm) instead")
    args = parser.parse_args()
    with recorded(RESULTS / "gpu_kit_build.json", model_sizes=["no model: the offline GPU kit"]) as record:
        with tempfile.TemporaryDirectory(prefix="tbench-kit-") as cache:
            env = {**os.environ, **({} if args.keep_cache else {"TBENCH_GPU_KIT_CACHE": cache})}
            started = time.monotonic()
            built = subprocess.run(
                [str(REPO / "scripts" / "gpu_kit.sh"), "--force"], cwd=REPO, env=env, text=True, capture_output=True
            )
            record["build_seconds"] = round(time.monotonic() - started, 1)
            record["build_exit_code"] = built.returncode
            record["build_log_tail"] = (built.stdout + built.stderr).strip().splitlines()[-8:]
            if built.returncode != 0:
                print("\n".join(record["build_log_tail"]), file=sys.stderr)
                return 1
            manifest = json.loads((REPO / "gpu_kit" / "manifest.json").read_text())
            record["cold_cache"] = not args.keep_cache
            record["parts"] = [
                {"name": p["name"], "mib": round(p["size"] / 2**20, 1), "transfer": p["transfer"]}
                for p in manifest["parts"]
            ]
            record["total_mib"] = round(manifest["total_bytes"] / 2**20, 1)
            started = time.monotonic()
            tests = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "tests/test_gpu_kit.py"],
                cwd=REPO,
                env={**env, "TBENCH_TEST_GPU_KIT_BUILD": "1"},
                text=True,
                capture_output=True,
            )
            summary = (tests.stdout.strip().splitlines() or [""])[-1]
            record["tests"] = {
                "exit_code": tests.returncode,
                "summary": summary,
                "passed": int(m.group(1)) if (m := re.search(r"(\d+) passed", summary)) else 0,
                "seconds": round(time.monotonic() - started, 1),
            }
    print(f"built in {record['build_seconds']} s, {record['total_mib']} MiB; tests: {summary}")
    return 0 if tests.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
