"""proto3 JSON codecs for the API, measured: our pydantic wire models against protobuf's
json_format over the official aiplatform message types, on the same CustomJob.

    .venv/bin/python bench/api_codec_bench.py [--n 5000]

Both parse (strict: unknown fields refused) and print the message back. The ratio is what
matters on a noisy machine; docs/api.md records a run.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

JOB: dict[str, Any] = {
    "displayName": "llama-8b",
    "labels": {"team": "pretrain", "run": "r42"},
    "jobSpec": {
        "persistentResourceId": "c1",
        "scheduling": {"timeout": "86400s", "strategy": "SPOT", "restartJobOnWorkerRestart": True},
        "baseOutputDirectory": {"outputUriPrefix": "gs://bucket/runs/r42"},
        "workerPoolSpecs": [{
            "machineSpec": {"machineType": "a3-highgpu-8g", "acceleratorType": "NVIDIA_H100_80GB",
                            "acceleratorCount": 8},
            "replicaCount": "64",
            "diskSpec": {"bootDiskType": "pd-ssd", "bootDiskSizeGb": 200},
            "containerSpec": {"imageUri": "local", "command": ["python", "train.py"],
                              "args": [f"--flag{i}=value{i}" for i in range(20)],
                              "env": [{"name": f"VAR_{i}", "value": str(i)} for i in range(20)]},
        }],
    },
}


def pydantic_round(n: int) -> float:
    from services.api.wire.custom_job import CustomJob

    start = time.perf_counter()
    for _ in range(n):
        CustomJob.model_validate(JOB).to_json()
    return time.perf_counter() - start


def protobuf_round(n: int) -> float:
    from google.cloud import aiplatform_v1
    from google.protobuf import json_format

    start = time.perf_counter()
    for _ in range(n):
        msg = aiplatform_v1.CustomJob.pb()()
        json_format.ParseDict(JOB, msg)
        json_format.MessageToDict(msg)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000)
    args = parser.parse_args()
    pydantic_round(200), protobuf_round(200)  # warm up imports and caches
    a = min(pydantic_round(args.n) for _ in range(3))
    b = min(protobuf_round(args.n) for _ in range(3))
    print(json.dumps({"messages": args.n, "pydantic_us_per_message": round(a / args.n * 1e6, 1),
                      "json_format_us_per_message": round(b / args.n * 1e6, 1),
                      "json_format_over_pydantic": round(b / a, 2)}))


if __name__ == "__main__":
    main()
