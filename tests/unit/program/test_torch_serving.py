"""The serving runtime's contract (Vertex's custom-container requirements), without a
network: the health route, predictions for {"instances": ...}, a model's own handler, and
the errors a caller can act on (400 for instances the model cannot take, 500 for its own
failure, 404 elsewhere)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from mtc_program.torch_serving import App, load


def call(app: App, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    data = b"" if body is None else json.dumps(body).encode()
    seen: list[str] = []
    out = app({"REQUEST_METHOD": method, "PATH_INFO": path, "CONTENT_LENGTH": str(len(data)),
               "wsgi.input": io.BytesIO(data)}, lambda status, headers: seen.append(status))
    return int(seen[0].split()[0]), json.loads(b"".join(out))


def doubling(instances: list[Any], parameters: Any) -> list[Any]:
    if parameters == "boom":
        raise RuntimeError("the model broke")
    return [2 * float(x) for x in instances]


def test_health_and_predict_routes() -> None:
    app = App(doubling, "/h", "/p")
    assert call(app, "GET", "/h") == (200, {})
    assert call(app, "POST", "/p", {"instances": [1, 2]}) == (200, {"predictions": [2.0, 4.0]})
    assert call(app, "GET", "/other")[0] == 404
    assert call(app, "GET", "/p")[0] == 405


def test_errors_say_whose_they_are() -> None:
    app = App(doubling, "/h", "/p")
    assert call(app, "POST", "/p", {"rows": []})[0] == 400
    assert call(app, "POST", "/p", {"instances": ["x"]})[0] == 400  # float("x"): ValueError
    status, body = call(app, "POST", "/p", {"instances": [1], "parameters": "boom"})
    assert status == 500 and "the model broke" in body["error"]
    assert (app.served, app.failed) == (0, 1)


def test_a_models_own_handler_is_loaded_from_its_directory(tmp_path: Path) -> None:
    (tmp_path / "handler.py").write_text(
        "def predict(instances, parameters):\n    return [len(str(i)) for i in instances]\n")
    assert load(tmp_path)(["ab", "abc"], None) == [2, 3]


def test_a_directory_with_nothing_to_serve_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="nothing to serve"):
        load(tmp_path)


def test_torchscript_rows_are_the_predictions(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    layer = torch.nn.Linear(2, 1)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 10.0]]))
        layer.bias.fill_(0.5)
    torch.jit.script(layer).save(str(tmp_path / "model.pt"))
    assert load(tmp_path)([[1.0, 2.0], [0.0, 1.0]], None) == [[21.5], [10.5]]


def test_a_recipes_causal_lm_completes_prompts_with_its_byte_tokenizer(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=259, hidden_size=16, intermediate_size=32,
                                      num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, max_position_embeddings=32)
    transformers.LlamaForCausalLM(config).save_pretrained(str(tmp_path))
    predict = load(tmp_path)
    [a, b] = predict(["12+30=", {"prompt": "upper abc:"}], {"maxOutputTokens": 4})
    assert isinstance(a, str) and isinstance(b, str)  # (untrained: what it says is noise)
    with pytest.raises(ValueError, match="maxOutputTokens"):
        predict(["x"], {"maxOutputTokens": 0})
    with pytest.raises(ValueError, match="a prompt"):
        predict([[1, 2]], None)
