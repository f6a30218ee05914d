"""mtc's serving runtime for Vertex AI's prebuilt PyTorch prediction images.

A serving replica's process, following Vertex's custom-container contract
(https://cloud.google.com/vertex-ai/docs/predictions/custom-container-requirements): it
listens on ``AIP_HTTP_PORT``, answers ``GET AIP_HEALTH_ROUTE`` with 200 once the model is
loaded and ``POST AIP_PREDICT_ROUTE`` with ``{"predictions": [...]}`` for a body
``{"instances": [...], "parameters": ...}``. The model is read from ``AIP_STORAGE_URI`` (a
directory on the node):

* ``handler.py`` with ``predict(instances, parameters) -> list``: the model's own code (what
  a TorchServe handler is to the prebuilt image), loaded once;
* else ``model.pt`` (or ``model.pth``, ``model.pts``): a TorchScript module, called on the
  instances as one tensor; its output's rows are the predictions;
* else ``config.json`` with safetensors weights: a causal LM (``transformers``, as the
  recipes save theirs); an instance is a prompt (a string, or ``{"prompt": ...}``) and its
  prediction the greedy completion, up to ``parameters.maxOutputTokens`` (default 16). Its
  tokenizer is the directory's own, else the recipes' byte-level one (ids 0-255 bytes, then
  PAD, BOS, EOS) when the vocabulary is that size.

HTTP is waitress (a production WSGI server, pure Python, already mtc's; docs/inference.md
says why), the request handling a small WSGI app. Run as a script
(``python torch_serving.py [--package FILE]...``): it imports nothing of mtc, so it runs
from any directory; each ``--package`` names a file of the model (what a sandboxed replica
is given to read) and is otherwise ignored.
"""

from __future__ import annotations

import importlib.util
import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

Predict = Callable[[list[Any], Any], list[Any]]
MODEL_FILES = ("model.pt", "model.pth", "model.pts")
REPORT_EVERY_S = 60.0  # a line of output now and then: an idle replica is not a quiet hang
MAX_BODY = 64 * 1024 * 1024


def load(directory: Path) -> Predict:
    """The model's predict function, from its directory."""
    handler = directory / "handler.py"
    if handler.is_file():
        spec = importlib.util.spec_from_file_location("mtc_model_handler", handler)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        fn: Predict = module.predict
        return fn
    for name in MODEL_FILES:
        path = directory / name
        if path.is_file():
            return _torchscript(path)
    if (directory / "config.json").is_file() and any(directory.glob("*.safetensors")):
        return _causal_lm(directory)
    raise SystemExit(f"AIP_STORAGE_URI {directory}: no handler.py, none of "
                     f"{', '.join(MODEL_FILES)}, no config.json with safetensors: nothing "
                     "to serve")


def _torchscript(path: Path) -> Predict:
    import torch

    module = torch.jit.load(str(path), map_location="cpu")  # type: ignore[no-untyped-call]
    module.eval()

    def predict(instances: list[Any], parameters: Any) -> list[Any]:
        with torch.inference_mode():
            out = module(torch.tensor(instances, dtype=torch.float32))
        rows: list[Any] = out.tolist()
        return rows

    return predict


BYTE_VOCAB, BYTE_BOS, BYTE_EOS = 259, 257, 258  # the recipes' tokenizer (lm_data.ByteTokenizer)
MAX_OUTPUT_TOKENS = 256


def _causal_lm(directory: Path) -> Predict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(directory))
    model.eval()  # type: ignore[no-untyped-call]
    if (directory / "tokenizer.json").is_file() or (directory / "tokenizer_config.json").is_file():
        own = AutoTokenizer.from_pretrained(str(directory))

        def encode(text: str) -> list[int]:
            return list(own.encode(text))

        def decode(ids: list[int]) -> str:
            return str(own.decode(ids, skip_special_tokens=True))

        eos = own.eos_token_id
    elif model.config.vocab_size == BYTE_VOCAB:

        def encode(text: str) -> list[int]:
            return [BYTE_BOS, *text.encode("utf-8")]

        def decode(ids: list[int]) -> str:
            return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

        eos = BYTE_EOS
    else:
        raise SystemExit(f"{directory}: a causal LM with no tokenizer files and a "
                         f"vocabulary of {model.config.vocab_size}: cannot read prompts")
    limit = getattr(model.config, "max_position_embeddings", 0) or 1 << 30

    def complete(prompt: str, max_tokens: int) -> str:
        ids = encode(prompt)
        out: list[int] = []
        with torch.inference_mode():
            for _ in range(max_tokens):
                if len(ids) >= limit:
                    break
                logits = model(torch.tensor([ids])).logits[0, -1]
                token = int(logits.argmax())
                if token == eos:
                    break
                ids.append(token)
                out.append(token)
        return decode(out)

    def predict(instances: list[Any], parameters: Any) -> list[Any]:
        wanted = (parameters or {}).get("maxOutputTokens", 16) if isinstance(
            parameters, dict) else 16
        if not isinstance(wanted, int) or not 0 < wanted <= MAX_OUTPUT_TOKENS:
            raise ValueError(f"parameters.maxOutputTokens: 1 to {MAX_OUTPUT_TOKENS}")
        prompts: list[str] = []
        for i in instances:
            prompt = i.get("prompt") if isinstance(i, dict) else i
            if not isinstance(prompt, str):
                raise ValueError('an instance is a prompt: a string or {"prompt": "..."}')
            prompts.append(prompt)
        return [complete(p, wanted) for p in prompts]

    return predict


class App:
    """The WSGI app: the health route, the predict route, 404 elsewhere."""

    def __init__(self, predict: Predict, health_route: str, predict_route: str) -> None:
        self.predict = predict
        self.health_route, self.predict_route = health_route, predict_route
        self.served = self.failed = 0
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "")
        if path == self.health_route and method == "GET":
            return _answer(start, 200, {})
        if path != self.predict_route:
            return _answer(start, 404, {"error": f"no route {path}"})
        if method != "POST":
            return _answer(start, 405, {"error": f"{method} {path}: use POST"})
        try:
            size = int(environ.get("CONTENT_LENGTH") or 0)
            if size > MAX_BODY:
                return _answer(start, 413, {"error": f"body over {MAX_BODY} bytes"})
            body = json.loads(environ["wsgi.input"].read(size) or b"null")
            if not isinstance(body, dict) or not isinstance(body.get("instances"), list):
                raise ValueError('the body is {"instances": [...], "parameters": ...}')
        except ValueError as exc:
            return _answer(start, 400, {"error": str(exc)})
        try:
            predictions = self.predict(body["instances"], body.get("parameters"))
        except (ValueError, TypeError) as exc:  # instances the model cannot take
            return _answer(start, 400, {"error": f"{type(exc).__name__}: {exc}"})
        except Exception as exc:  # the model's own failure: the caller sees it, we go on
            with self._lock:
                self.failed += 1
            return _answer(start, 500, {"error": f"{type(exc).__name__}: {exc}"})
        with self._lock:
            self.served += 1
        return _answer(start, 200, {"predictions": predictions})


def _answer(start: Callable[..., Any], status: int, body: dict[str, Any]) -> list[bytes]:
    data = json.dumps(body).encode()
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
              413: "Payload Too Large", 500: "Internal Server Error"}[status]
    start(f"{status} {reason}", [("Content-Type", "application/json"),
                                 ("Content-Length", str(len(data)))])
    return [data]


def _report(app: App) -> None:
    while True:
        time.sleep(REPORT_EVERY_S)
        print(f"serving: {app.served} predictions answered, {app.failed} failed", flush=True)


def main() -> None:
    import waitress

    port = int(os.environ.get("AIP_HTTP_PORT", "8080"))
    health = os.environ.get("AIP_HEALTH_ROUTE", "/health")
    route = os.environ.get("AIP_PREDICT_ROUTE", "/predict")
    storage = os.environ.get("AIP_STORAGE_URI", "")
    if not storage:
        raise SystemExit("AIP_STORAGE_URI is not set: no model to serve")
    started = time.monotonic()
    app = App(load(Path(storage)), health, route)
    print(f"serving {storage} on port {port} (loaded in {time.monotonic() - started:.1f}s): "
          f"health {health}, predict {route}", flush=True)
    threading.Thread(target=_report, args=(app,), daemon=True).start()
    waitress.serve(app, host=os.environ.get("MTC_SERVING_BIND", "127.0.0.1"), port=port,
                   threads=8, _quiet=True)


if __name__ == "__main__":
    main()
